"""Fragment: prefix keys as the read and the holdings use them, the twins of
``genq.common.prefixes``' ``scoped``, ``adapter_key`` and ``cache_key_of`` (a test compares them).
"""

from __future__ import annotations

from genq.common.lua.compose import Fragment
from genq.common.prefixes import ADAPTER_RAW, KEY_CHARS

PREFIX_KEYS = Fragment(
    "prefix keys",
    ("scoped", "adapter_key", "cache_key_of"),
    f"""
local function scoped(tenant, key, shared, model)
  local scope = shared and '*' or tenant
  if model and model ~= '' then scope = model .. '\\31' .. scope end
  return string.sub(redis.sha1hex(scope .. '\\30' .. key), 1, {KEY_CHARS})
end
local function adapter_key(m)
  return scoped('', '{ADAPTER_RAW}', true, m)
end
local function cache_key_of(k)
  return string.sub(redis.sha1hex('k\\30' .. k), 1, {KEY_CHARS})
end
""",
)
