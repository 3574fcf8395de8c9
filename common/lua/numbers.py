"""Fragment: a number from a JSON text without decoding it (the read's charge, a batch's tally)."""

from __future__ import annotations

from genq.common.lua.compose import Fragment

NUMBER = Fragment(
    "number",
    ("number_of",),
    """
local function number_of(doc, key, pattern)
  -- The number of pattern's first match in the JSON text doc ('"NAME":%s*(%d+)'), or nil. Its
  -- key ('"NAME":', where every match starts) is searched for as plain text first, which skips
  -- along the text where a pattern's search tries each position: five times less for a body
  -- with an 8 KB prompt. Same answer: no match starts before it.
  local at = string.find(doc, key, 1, true)
  if not at then return nil end
  return tonumber(string.match(doc, pattern, at) or '')
end
""",
)
