"""Prefix keys: which requests share the context an engine caches, known without a tokenizer.

A request's **prefix key** names the part of its prompt that other requests are likely to send
again, so that the read can place it on a worker whose engine still holds that part (issue: a
pull queue's cache-aware placement). It is computed where a request is built (the client, the
gateway), carried in the body as ``prefix_key`` (its first field, so scripts find it without
decoding the body) and never trusted as more than a hint: a wrong key costs a cache miss, not a
wrong answer.

- ``prompt_cache_key`` (OpenAI's name; a client option and a body field) wins: requests that
  give the same one share a key.
- A chat: a hash chained over its messages, all but the last (the newest turn): a chat resent
  with one more turn has the key of the conversation it continues, and requests with one
  system prompt (and few-shot messages) share one. A chat of one message is a prompt.
- A plain prompt: a hash of its first ``PREFIX_BYTES`` bytes, if it is longer than that (a
  shorter one has no key: there is little to gain).

Keys are **per tenant** where they are used: the scripts and the worker scope a key by its
tenant (``scoped``), so a cache hit never tells one tenant what another sent, unless the
tenant's setting ``share_prefixes`` says its prompts may share cache with other sharing tenants.
``SCOPED_LUA`` is ``scoped``'s twin in the scripts (a test compares them).

A LoRA adapter's requests without a prefix key carry the adapter's key (``adapter_key``): the
workers that have the adapter loaded hold it, so the read places them as it places prefixes.

The worker also holds the key of what comes next: a chat's conversation with the reply it just
generated appended (``continuation_key``) is the key of the next turn's request.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any

PREFIX_BYTES = 1024
"""A plain prompt longer than this is keyed by its first so many bytes (UTF-8)."""
KEY_CHARS = 16
"""A key is this many hex characters of a SHA-1 (64 bits: collisions cost a cache miss)."""
MAX_PROMPT_CACHE_KEY_CHARS = 256
"""The longest ``prompt_cache_key`` accepted."""


def _sha(text: bytes) -> str:
    return hashlib.sha1(text, usedforsecurity=False).hexdigest()[:KEY_CHARS]


def _message_text(message: Any) -> bytes:
    """One message in canonical form: role, content, tool calls, tool call id, name."""

    def get(name: str) -> Any:
        return message.get(name) if isinstance(message, dict) else getattr(message, name, None)

    calls = get("tool_calls")
    if calls:
        calls = [c if isinstance(c, dict) else c.model_dump(mode="json") for c in calls]
    parts = [
        get("role") or "",
        get("content") or "",
        json.dumps(calls, sort_keys=True, separators=(",", ":")) if calls else "",
        get("tool_call_id") or "",
        get("name") or "",
    ]
    return "\x1f".join(parts).encode("utf-8", "surrogatepass")


def chat_chain(messages: Sequence[Any]) -> list[str]:
    """The chained key after each message: ``chain[i]`` names messages ``0..i``."""
    out: list[str] = []
    parent = "c"
    for m in messages:
        parent = _sha(parent.encode() + b"\x1e" + _message_text(m))
        out.append(parent)
    return out


def cache_key_of(prompt_cache_key: str) -> str:
    """The key of requests that give this ``prompt_cache_key``."""
    return _sha(b"k\x1e" + prompt_cache_key.encode("utf-8", "surrogatepass"))


def prompt_key(prompt: str) -> str | None:
    """A plain prompt's key: its first ``PREFIX_BYTES`` bytes, if it is longer than that."""
    data = prompt.encode("utf-8", "surrogatepass")
    if len(data) <= PREFIX_BYTES:
        return None
    return _sha(b"p\x1e" + data[:PREFIX_BYTES])


def prefix_key(
    *,
    prompt: str | None = None,
    messages: Sequence[Any] | None = None,
    prompt_cache_key: str | None = None,
) -> str | None:
    """A request's prefix key (see the module docstring), or None when it has none."""
    if prompt_cache_key:
        return cache_key_of(prompt_cache_key)
    if messages:
        if len(messages) > 1:
            return chat_chain(messages[:-1])[-1]
        only = messages[0]
        content = only.get("content") if isinstance(only, dict) else only.content
        return prompt_key(content) if content else None
    return prompt_key(prompt) if prompt else None


def continuation_key(messages: Sequence[Any], reply: str) -> str:
    """The key of the next turn of a chat: its messages and the assistant's ``reply``."""
    return chat_chain([*messages, {"role": "assistant", "content": reply}])[-1]


def scoped(tenant: str, key: str, shared: bool = False, model: str | None = None) -> str:
    """A key as the read and the fleet's holdings use it: per tenant, unless ``shared`` (the
    tenant's ``share_prefixes``: keys of all sharing tenants meet), and per model (its lane:
    another model's cache holds nothing of it). ``SCOPED_LUA``'s twin."""
    scope = "*" if shared else tenant
    if model:
        scope = f"{model}\x1f{scope}"
    return _sha(f"{scope}\x1e{key}".encode())


ADAPTER_RAW = "lora"
"""What an adapter's key is made of beside its name: not hex, so no prefix key meets it."""


def adapter_key(adapter: str) -> str:
    """The key an entry for the LoRA adapter ``adapter`` carries when it has no prefix key:
    the workers holding the adapter hold it, so the read places the entry where the adapter
    is loaded, by the prefixes' rule and bound. One per adapter, whoever sent the request (an
    adapter is a model every tenant may name: ``/v1/models`` lists it). ``adapter_key`` in
    ``SCOPED_LUA`` is its twin."""
    return scoped("", ADAPTER_RAW, True, adapter)


SCOPED_LUA = f"""
local function scoped(tenant, key, shared, model)  -- prefixes.py: scoped(); a test compares them
  local scope = shared and '*' or tenant
  if model and model ~= '' then scope = model .. '\\31' .. scope end
  return string.sub(redis.sha1hex(scope .. '\\30' .. key), 1, {KEY_CHARS})
end
local function adapter_key(m)  -- prefixes.py: adapter_key()
  return scoped('', '{ADAPTER_RAW}', true, m)
end
local function cache_key_of(k)  -- prefixes.py: cache_key_of()
  return string.sub(redis.sha1hex('k\\30' .. k), 1, {KEY_CHARS})
end
"""

WINDOW = 32
"""How many of a tenant's waiting entries the read looks at for one whose prefix it holds."""
MAX_HOLDERS = 4
"""The most workers a prefix is known to be held by (the most recent first)."""
HOLDINGS_TTL_S = 86_400
"""The holders and load hashes expire a day after their last write (a queue nobody serves)."""

AFFINITY_LUA = f"""
-- Affinity (prefixes.py): which of a tenant's waiting items this reader takes. Needs me and
-- now_ms; AFF_WAIT_MS (0: off, plain LPOP) and AFF_FACTOR are set by the read from its ARGV.
local AFF_WAIT_MS, AFF_FACTOR = 0, 1.5
-- Lanes (their BASE) where this call passed items over for the first time: the read rings
-- their doorbells once (an idle holder blocks on it, and would not read for seconds).
local PASSED = {{}}
local loads = nil
local function load_view()
  -- The live workers' loads (genq:{{Q}}:load, published with their heartbeats; a worker is
  -- live while its stats hash is, which its claim keeper renews even during a long batch),
  -- and their mean. A dead worker's entry is dropped here.
  if loads == nil then
    loads = {{live = {{}}, mean = 0}}
    local flat, n, sum = redis.call('HGETALL', QBASE .. ':load'), 0, 0
    for j = 1, #flat, 2 do
      if redis.call('EXISTS', QBASE .. ':worker:' .. flat[j]) == 1 then
        loads.live[flat[j]] = tonumber(flat[j + 1]) or 0
        n, sum = n + 1, sum + (tonumber(flat[j + 1]) or 0)
      else
        redis.call('HDEL', QBASE .. ':load', flat[j])
      end
    end
    loads.mean = n > 0 and sum / n or 0
  end
  return loads
end
local function available(w)  -- live, and not above the load bound
  local v = load_view()
  local held = v.live[w]
  return held ~= nil and held <= v.mean * AFF_FACTOR + 1
end
-- LoRA adapters: an item of an adapter's lane whose key is the adapter's (adapter_key) is
-- taken while nobody holds the adapter only by a reader with a free adapter slot (its
-- --max-loras less the adapters it holds, told by HOLD's '#N': genq:{{Q}}:slots), a slot each
-- new adapter it takes: adapters spread over the fleet instead of every worker loading all.
local lane_adapter, free_slots, slot_of = {{}}, nil, {{}}
local function adapter_item(k)  -- whether key k is the current lane's adapter's
  if LANE == '' then return false end
  lane_adapter[LANE] = lane_adapter[LANE] or adapter_key(LANE)
  return k == lane_adapter[LANE]
end
local function has_slot(k)  -- this reader may load adapter key k (and counts the slot)
  if slot_of[k] then return true end
  if free_slots == nil then
    free_slots = tonumber(redis.call('HGET', QBASE .. ':slots', me) or '') or math.huge
  end
  if free_slots <= 0 then return false end
  free_slots, slot_of[k] = free_slots - 1, true
  return true
end
local seen = {{}}  -- per index: {{its first items this call read, all with no key; whole list?}}
local function pick_items(idx, n)
  -- Up to n items of the index idx for this reader, and whether it left some for another
  -- worker: first those whose key this reader holds (unless it is above the load bound), then
  -- those with no key, and those no available worker holds when the reader has none of its
  -- own in sight, then those passed over for AFF_WAIT_MS or more (anyone with room). An item
  -- another available worker holds waits for it: the first reader to pass it over marks when
  -- (its third field), and from then on the bound runs (delay scheduling: measured from the
  -- pass-over, not from the submission, so a backlog is not "late" merely for being long).
  if AFF_WAIT_MS <= 0 then return redis.call('LPOP', idx, n) or {{}}, false end
  local sight = math.max({WINDOW}, n)  -- how far this pick looks
  local known = seen[idx]
  if known and (known[2] or known[1] >= sight) then
    -- This call read that far already and found no key, and the index only lost items from
    -- its front since: the pick below would take the first n (the reads of a tenant's
    -- entries one by one, ``take``, read the window once).
    local out = redis.call('LPOP', idx, n) or {{}}
    known[1] = known[1] - #out
    return out, false
  end
  local ask = sight + {WINDOW}  -- and a window more, for the picks after this one
  local items = redis.call('LRANGE', idx, 0, ask - 1)
  local keyed = false  -- an item with a key holds a space ('ID KEY'); work with no prefix has none
  for j = 1, math.min(#items, sight) do
    if string.find(items[j], ' ', 1, true) then keyed = true break end
  end
  if not keyed then  -- nothing in sight has a prefix: the first n, in order (as below, cheaper)
    local out = {{unpack(items, 1, math.min(n, #items))}}
    if #out > 0 then redis.call('LPOP', idx, #out) end
    local clear = #items  -- how many of the items read have no key
    for j = sight + 1, #items do
      if string.find(items[j], ' ', 1, true) then clear = j - 1 break end
    end
    seen[idx] = {{clear - #out, clear == #items and #items < ask}}
    return out, false
  end
  seen[idx] = nil
  if #items > sight then items = {{unpack(items, 1, sight)}} end
  local late, mine, free, cold, left = {{}}, {{}}, {{}}, {{}}, false
  local me_ok = nil  -- looked up at the first keyed item (keyless work needs no load view)
  for j, it in ipairs(items) do
    local k = item_key(it)
    local since = tonumber(string.match(it, '^%S+ %x+ (%d+)$'))
    if k == nil then table.insert(free, j)
    elseif since and now_ms - since >= AFF_WAIT_MS then table.insert(late, j)
    else
      local holders = redis.call('HGET', QBASE .. ':holders', k)
      local ours, other = false, false
      for w in string.gmatch(holders or '', '%S+') do
        if w == me then ours = true elseif available(w) then other = true end
      end
      if ours and me_ok == nil then me_ok = available(me) or load_view().live[me] == nil end
      if ours and me_ok then table.insert(mine, j)
      elseif not other then table.insert(cold, j)
      else
        left = true
        if not since then  -- passed over for the first time: the bound starts now
          items[j] = item_id(it) .. ' ' .. k .. ' ' .. now_ms
          redis.call('LSET', idx, j - 1, items[j])
          PASSED[BASE] = true
        end
      end
    end
  end
  -- Prefixes nobody holds: taken by a reader with none of its own in sight; one that has its
  -- own work leaves them (marked passed over: within the bound, a reader without work of its
  -- own takes them, after it anyone with room), so workers keep to their prefixes instead of
  -- each taking a little of every new one.
  for _, j in ipairs(cold) do
    local k = item_key(items[j])
    local ok
    if adapter_item(k) then ok = has_slot(k) else ok = #mine == 0 end
    if ok then table.insert(free, j)
    else
      left = true
      local it = items[j]
      if not string.match(it, '^%S+ %x+ %d+$') then
        items[j] = it .. ' ' .. now_ms
        redis.call('LSET', idx, j - 1, items[j])
        PASSED[BASE] = true
      end
    end
  end
  table.sort(free)
  local chosen = {{}}
  for _, group in ipairs({{mine, free, late}}) do
    for _, j in ipairs(group) do
      if #chosen < n then table.insert(chosen, j) end
    end
  end
  table.sort(chosen)  -- in their order: the oldest first
  local out, prefix = {{}}, true
  for c, j in ipairs(chosen) do
    out[c] = items[j]
    if j ~= c then prefix = false end
  end
  if prefix then
    if #out > 0 then redis.call('LPOP', idx, #out) end
  else
    for _, it in ipairs(out) do redis.call('LREM', idx, 1, it) end
  end
  return out, left and #out < n
end
local function unpicked(idx, item)  -- an item picked, put back in front of its index
  redis.call('LPUSH', idx, item)
  seen[idx] = nil
end
"""

HOLD = f"""
-- KEYS: the queue's config key (genq:{{Q}}:config: the base of the others)
-- ARGV: this worker, then keys: '+KEY' it holds now, '-KEY' it no longer holds; '#N': it
--       has N free adapter slots (genq:{{Q}}:slots)
-- Which prefixes (and adapters) this worker holds (genq:{{Q}}:holders: key -> its holders,
-- the most recent first, at most {MAX_HOLDERS}). Its load goes with its heartbeat
-- (genq:{{Q}}:load).
local base = string.sub(KEYS[1], 1, #KEYS[1] - #':config')
local me = ARGV[1]
local function hold(op, k)
  local list = {{}}
  if op == '+' then table.insert(list, me) end
  for w in string.gmatch(redis.call('HGET', base .. ':holders', k) or '', '%S+') do
    if w ~= me and #list < {MAX_HOLDERS} then table.insert(list, w) end
  end
  if #list > 0 then
    redis.call('HSET', base .. ':holders', k, table.concat(list, ' '))
  else
    redis.call('HDEL', base .. ':holders', k)
  end
end
for j = 2, #ARGV do
  local op, k = string.sub(ARGV[j], 1, 1), string.sub(ARGV[j], 2)
  if op == '#' then
    redis.call('HSET', base .. ':slots', me, k)
    redis.call('EXPIRE', base .. ':slots', {HOLDINGS_TTL_S})
  else
    hold(op, k)
  end
end
redis.call('EXPIRE', base .. ':holders', {HOLDINGS_TTL_S})
return #ARGV - 1
"""
