"""Constrained decoding on the transformers engines (``static``, ``continuous``): a request's
``response_format`` compiled to a grammar by xgrammar, and a logits processor that lets each
constrained row pick only the tokens its grammar allows next.

- **Compiling** happens once per distinct format per worker, when a request is admitted (so a
  format xgrammar cannot compile fails that request alone, ``invalid_request``, before it joins
  a batch). ``GrammarCache`` keeps compiled grammars by the format's ``cache_key`` (a schema's
  key order does not matter), least recently used first out, up to ``GRAMMAR_CACHE_MAX_BYTES``
  of xgrammar's own measure of them (``CompiledGrammar.memory_size_bytes``): a batch job that
  sends one schema 100,000 times compiles it once.
- **Decoding**: ``RowGrammar`` holds one ``GrammarMatcher`` per constrained row; at each step
  it feeds each matcher the token picked last, fills that row's allowed-token bitmask and masks
  the row's logits. Rows without a format are untouched, so a greedy row's output does not
  depend on its batch-mates, and rows with different formats share a batch. Once a row's
  grammar is complete only eos is allowed, so the row ends there.

JSON is generated compact (xgrammar's ``any_whitespace=False``: one space after ``:`` and
``,``, none elsewhere): small models given free whitespace can loop on newlines until
``max_new_tokens``. Schemas are compiled in xgrammar's strict mode: properties a schema does not
name are never generated (what OpenAI's ``strict: true`` asks; the output is valid either way).
"""

from __future__ import annotations

import json
import re
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from genq.common.errors import InvalidRequest
from genq.common.formats import ResponseFormat

GRAMMAR_CACHE_MAX_BYTES = 512 * 1024 * 1024
"""Most compiled-grammar bytes a worker keeps (a JSON schema's grammar is about 1 MiB with a
50,000-token vocabulary)."""
COMPILE_THREADS = 2
"""Threads xgrammar uses to compile one grammar."""
_XGRAMMAR_PREFIX = re.compile(r"^\[[^\]]*\] \S+:\d+: ")
"""``[17:29:38] /project/cpp/json_schema_converter.cc:4944: `` before xgrammar's messages."""


@dataclass(frozen=True, slots=True)
class Constraint:
    """A compiled response format, ready for ``RowGrammar``."""

    key: str
    """The format's ``cache_key``."""
    compiled: Any
    """xgrammar's ``CompiledGrammar``."""


class GrammarCache:
    """Compiled grammars of one model's tokenizer, by response format (see the module)."""

    def __init__(
        self,
        tokenizer: Any,
        *,
        vocab_size: int,
        stop_token_ids: Sequence[int],
        max_bytes: int = GRAMMAR_CACHE_MAX_BYTES,
    ) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.stop_token_ids = list(stop_token_ids)
        self.max_bytes = max_bytes
        self._compiler: Any = None  # built at the first format: 0.1-0.2 s for a 50k vocabulary
        self._entries: OrderedDict[str, tuple[Constraint, int]] = OrderedDict()
        self.bytes = 0
        """Compiled-grammar bytes held now."""
        self.hits = 0
        self.misses = 0
        """Formats found compiled / compiled (each compile is one miss)."""

    def constraint(self, fmt: ResponseFormat) -> Constraint:
        """The compiled grammar of ``fmt``, from the cache or compiled now; raise
        InvalidRequest saying why xgrammar cannot compile it."""
        key = fmt.cache_key()
        found = self._entries.get(key)
        if found is not None:
            self._entries.move_to_end(key)
            self.hits += 1
            return found[0]
        self.misses += 1
        try:
            compiled = self._compile(fmt)
        except Exception as err:  # xgrammar raises RuntimeError (and others) for what it refuses
            message = _XGRAMMAR_PREFIX.sub("", str(err).strip()).splitlines()
            why = message[0] if message else type(err).__name__
            raise InvalidRequest(
                f"response_format ({fmt.type}) cannot be compiled to a grammar: {why}"
            ) from None
        size = int(compiled.memory_size_bytes)
        constraint = Constraint(key, compiled)
        self._entries[key] = (constraint, size)
        self.bytes += size
        while self.bytes > self.max_bytes and len(self._entries) > 1:
            _, (_, freed) = self._entries.popitem(last=False)
            self.bytes -= freed
        return constraint

    def __len__(self) -> int:
        return len(self._entries)

    def _compile(self, fmt: ResponseFormat) -> Any:
        import xgrammar as xgr

        if self._compiler is None:
            info = xgr.TokenizerInfo.from_huggingface(
                self.tokenizer, vocab_size=self.vocab_size, stop_token_ids=self.stop_token_ids
            )
            self._compiler = xgr.GrammarCompiler(
                info, max_threads=COMPILE_THREADS, cache_enabled=False
            )
        compiler = self._compiler
        if fmt.type == "json_schema" and fmt.json_schema is not None:
            schema = json.dumps(fmt.json_schema.schema_)
            return compiler.compile_json_schema(schema, any_whitespace=False, strict_mode=True)
        if fmt.type == "json_object":
            return compiler.compile_json_schema('{"type": "object"}', any_whitespace=False)
        if fmt.type == "regex" and fmt.regex is not None:
            return compiler.compile_regex(fmt.regex)
        if fmt.type == "choice" and fmt.choice is not None:
            return compiler.compile_grammar(xgr.Grammar.from_ebnf(choice_grammar(fmt.choice)))
        raise ValueError(f"nothing to compile for type {fmt.type!r}")


def choice_grammar(choices: Sequence[str]) -> str:
    """An EBNF grammar whose language is exactly ``choices`` (JSON string escapes, which
    xgrammar's EBNF literals read)."""
    return "root ::= " + " | ".join(json.dumps(c, ensure_ascii=False) for c in choices)


class RowGrammar:
    """Logits processor (see the module): each constrained row's logits masked to what its
    grammar allows next. A row whose matcher refuses the token picked (the row already ended,
    and ``generate`` pads it) is left alone from then on."""

    def __init__(self, constraints: Sequence[Any], vocab_size: int) -> None:
        import xgrammar as xgr

        self._xgr = xgr
        self.rows = [(i, xgr.GrammarMatcher(c.compiled)) for i, c in enumerate(constraints) if c]
        self.live = [True] * len(self.rows)
        self.bitmask = xgr.allocate_token_bitmask(len(constraints), vocab_size)
        self.vocab_size = vocab_size
        self.started = False

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        if self.started:
            last = input_ids[:, -1].tolist()
            for n, (i, matcher) in enumerate(self.rows):
                if self.live[n] and not matcher.accept_token(last[i]):
                    self.live[n] = False
        self.started = True
        active = []
        for n, (i, matcher) in enumerate(self.rows):
            if self.live[n] and not matcher.is_terminated():
                matcher.fill_next_token_bitmask(self.bitmask, i)
                active.append(i)
        if active:
            self._xgr.apply_token_bitmask_inplace(
                scores,
                self.bitmask.to(scores.device, non_blocking=True),
                vocab_size=self.vocab_size,
                indices=active,
            )
        return scores
