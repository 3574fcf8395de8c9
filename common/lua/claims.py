"""Fragment: how a worker's read claims waiting entries, ``claim``, which answers what
``XCLAIM`` answers for a list of entry ids, for less.

``XCLAIM`` by id with the entries' fields in its answer seeks each entry in its stream twice
(to check that it exists, then to answer it). Claimed by id alone (``JUSTID``) and read back
in one ``XRANGE`` over the claimed ids' span (one walk along the stream), the same entries
cost Redis less. A tenant's waiting entries of one priority lie one after another in their
stream, in the order the read takes them, so the span holds little else; an entry the bounded
span missed (ids out of order, or far apart) is read alone.
"""

from __future__ import annotations

from genq.common.keys import GROUP
from genq.common.lua.compose import Fragment

SPAN_SLACK = 16
"""The span's ``XRANGE`` reads at most twice the claimed entries plus this many: a span full
of other workers' entries costs no more than reading each claimed entry alone."""

CLAIM = Fragment(
    "claim",
    ("claim",),
    f"""
local function claim(stream, me, ids)
  -- XCLAIM's answer for ids (min idle 0): those still pending, with their fields, in ids'
  -- order, now pending for me. One alone: XCLAIM itself, as cheap.
  local n = #ids
  if n == 1 then return redis.call('XCLAIM', stream, '{GROUP}', me, 0, ids[1]) end
  ids[n + 1] = 'JUSTID'
  local got = redis.call('XCLAIM', stream, '{GROUP}', me, 0, unpack(ids))
  ids[n + 1] = nil
  n = #got
  if n == 0 then return got end
  -- One walk along the span: the claimed ids in order, skipping what lies between them.
  local out, j = {{}}, 1
  for _, e in ipairs(redis.call('XRANGE', stream, got[1], got[n], 'COUNT', 2 * n + {SPAN_SLACK})) do
    if e[1] == got[j] then
      out[j] = e
      j = j + 1
    end
  end
  for k = j, n do  -- out of order or past the span: the rest one by one, in their order
    out[#out + 1] = redis.call('XRANGE', stream, got[k], got[k])[1]
  end
  return out
end
""",
)
