#!/usr/bin/env bash
# The prepared GPU check: the GPU measurements BENCHMARKS.md reports, in one go, as one table.
#
#   scripts/gpu_check.sh prepare
#       Here, with the package registries (Debian's and PyPI): fills .gpu_check/ with
#       redis-server (Debian's packages, to unpack there) and wheels of genq and of everything
#       genq[worker] needs beside torch, for the GPU machine's Python (GPU_PYTHON, default 3.12).
#   scripts/gpu_check.sh run [--dry-run] [--output FILE] [--limit-s S] [--only TEXT]...
#       On a bare GPU machine that has CUDA torch and transformers but no Redis, no vLLM and no
#       network: unpacks redis-server, installs genq and the wheels into a folder on PYTHONPATH
#       in front of the machine's own packages (its CUDA torch), then runs the cases
#       (genq.worker.devtools.gpu_check) within 8 minutes and writes the table (default
#       gpu_check.md). Where genq is installed already (.venv here) it uses that, and without
#       .gpu_check/ the redis-server on PATH: that is how --dry-run, the same cases on the CPU
#       with the tiny model, is tested.
#
# With the device tool: `scripts/gpu_check.sh prepare` here, then
#   run(command='scripts/gpu_check.sh run --output "$OUT/gpu_check.md"', carry=[".gpu_check"])
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=.gpu_check

prepare() {
    local py="${PYTHON:-.venv/bin/python}" target="${GPU_PYTHON:-3.12}"
    rm -rf "$DIR" && mkdir -p "$DIR/debs" "$DIR/wheels"
    (cd "$DIR/debs" && apt-get download -q redis-server redis-tools libjemalloc2 liblzf1)
    "$py" -m pip wheel -q --no-deps -w "$DIR/wheels" .
    # Everything genq[worker] needs but torch (and what only torch needs), at the versions this
    # environment runs, for the target Python.
    "$py" - <<'EOF' >"$DIR/requirements.txt"
from importlib.metadata import distribution
from packaging.requirements import Requirement

skip = {"torch", "triton", "sympy", "networkx", "mpmath"}
seen, todo = {}, [Requirement("genq[worker]")]
while todo:
    req = todo.pop()
    name = req.name.lower().replace("_", "-")
    if name in seen or name in skip or name.startswith(("nvidia-", "cuda-")):
        continue
    try:
        dist = distribution(req.name)
    except Exception:
        continue
    seen[name] = dist.version
    for dep in dist.requires or []:
        sub = Requirement(dep)
        if sub.marker is None or sub.marker.evaluate({"extra": next(iter(req.extras), "")}):
            todo.append(sub)
seen.pop("genq", None)
print("\n".join(f"{n}=={v}" for n, v in sorted(seen.items())))
EOF
    "$py" -m pip download -q --no-deps --only-binary=:all: --python-version "$target" \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 --platform any -d "$DIR/wheels" \
        -r "$DIR/requirements.txt"
    du -sh "$DIR"
}

run() {
    if [ -d "$DIR/debs" ]; then
        local root="$DIR/redis"
        rm -rf "$root" && mkdir -p "$root"
        for deb in "$DIR"/debs/*.deb; do dpkg-deb -x "$deb" "$root"; done
        export PATH="$PWD/$root/usr/bin:$PATH"
        export LD_LIBRARY_PATH="$PWD/$root/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    fi
    local py="${PYTHON:-python3}"
    if [ -z "${PYTHON:-}" ] && [ -x .venv/bin/python ]; then py=.venv/bin/python; fi
    # An install from an earlier run in this tree (several runs in one device call).
    if [ -d "$DIR/site" ] && [ -z "${PYTHON:-}" ] && [ ! -x .venv/bin/python ]; then
        export PYTHONPATH="$PWD/$DIR/site${PYTHONPATH:+:$PYTHONPATH}"
    fi
    if ! "$py" -c "import genq.worker.devtools.gpu_check" 2>/dev/null; then
        [ -d "$DIR/wheels" ] || { echo "genq is not installed: run 'prepare' first" >&2; exit 2; }
        # Into a folder put first on PYTHONPATH, the machine's own packages (its CUDA torch)
        # behind it. Not a venv: one made by a python that is itself a venv's (as on the device
        # machines) would not see that venv's packages, torch among them.
        rm -rf "$DIR/site"
        "$py" -m pip install -q --no-index --no-deps --no-compile --target "$DIR/site" \
            "$DIR"/wheels/*.whl
        export PYTHONPATH="$PWD/$DIR/site${PYTHONPATH:+:$PYTHONPATH}"
    fi
    command -v redis-server >/dev/null || { echo "no redis-server: run 'prepare' first" >&2; exit 2; }
    "$py" -m genq.worker.devtools.gpu_check "$@"
}

case "${1:-}" in
    prepare) prepare ;;
    run) shift; run "$@" ;;
    *) sed -n '2,18p' "$0" >&2; exit 2 ;;
esac
