"""Fragment: ``is_final``, ``genq.common.states.is_final`` in the scripts, read the same way."""

from __future__ import annotations

from genq.common.lua.compose import Fragment
from genq.common.models import FINAL_STATUSES

_TABLE = "{" + ", ".join(f"[{s!r}]=true" for s in sorted(FINAL_STATUSES)) + "}"

FINAL = Fragment(
    "final states",
    ("FINAL", "is_final"),
    f"""
local FINAL = {_TABLE}
local function is_final(raw)
  if not raw then return false end
  -- Every state genq writes starts with its id (which holds no quote) and then its status:
  -- read that without decoding the whole document, which costs several times more.
  local status = string.match(raw, '^{{"id":"[^"]*","status":"(%a+)"')
  if status then return FINAL[status] == true end
  local ok, doc = pcall(cjson.decode, raw)
  return ok and type(doc) == 'table' and FINAL[doc['status']] == true
end
""",
)
