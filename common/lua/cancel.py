"""The cancel function's script (``genq_cancel`` of the Functions library): a queued or
running request cancelled, its final event written, its webhook event added as APPLY adds it."""

from __future__ import annotations

from genq.common.lua.compose import script
from genq.common.lua.final_states import FINAL
from genq.common.lua.hook import HOOK
from genq.common.settings import DEFAULT_RESULT_TTL_S
from genq.common.wire import EVENT_DATA_FIELD, EVENT_TYPE_FIELD, FINAL_EVENT

CANCEL = script(
    "cancel",
    f"""
-- KEYS: state key, event key, attempts key of one request [, its owner record key (its
--       response's, or its batch's for a batch line), the queue's webhook outbox: the
--       response's or the batch's webhook event is then added as APPLY adds it]
-- ARGV: [ttl_s (default {DEFAULT_RESULT_TTL_S})]
-- Returns 1 (cancelled: its state is now final 'cancelled', with its final event), 0 (it was
-- final already: nothing changed) or -1 (no such request: never submitted, or expired).
local res, ev, att = KEYS[1], KEYS[2], KEYS[3]
local ttl = tonumber(ARGV[1] or '') or {DEFAULT_RESULT_TTL_S}
local current = redis.call('GET', res)
if not current then return -1 end
if is_final(current) then return 0 end
local ok, doc = pcall(cjson.decode, current)
if not ok or type(doc) ~= 'table' then
  return redis.error_reply('GENQ_INVALID the state at ' .. res .. ' is not a JSON object')
end
local t = redis.call('TIME')
local id = doc['id']
doc['id'], doc['status'], doc['entry'] = nil, nil, nil
doc['error'] = {{code = 'cancelled', message = 'cancelled by a client'}}
if type(doc['timings']) ~= 'table' then doc['timings'] = {{}} end
doc['timings']['finished_unix_ms'] = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
-- Every state starts with its id and status (the scripts and clients read them there).
local state = '{{"id":' .. cjson.encode(id) .. ',"status":"cancelled",'
  .. string.sub(cjson.encode(doc), 2)
redis.call('SET', res, state, 'EX', ttl)
redis.call('DEL', att)
if not (KEYS[5] and hook(KEYS[5], KEYS[4], state)) then  -- a wave batch's line: none
  redis.call('XADD', ev, '*', '{EVENT_TYPE_FIELD}', '{FINAL_EVENT}', '{EVENT_DATA_FIELD}', state)
  redis.call('EXPIRE', ev, ttl)
end
flush_tallies()
return 1
""",
    FINAL,
    HOOK,
)
"""One request cancelled (see the comment at its top)."""
