"""Fragments: the priorities in stream order, and lanes (a model's work keys: ``Keys.lane``).

``PRI`` lists the priorities as the work streams order them (a stream's number in a call
indexes it). ``LANES`` holds the queue's base (``QBASE``, its config key, the script's first
KEY, less ``:config``) for what every lane shares (tenants and their accounts), and the lane
being worked on (``BASE``, ``LANE``: its base and model, set by ``use_lane``) for its work keys.
"""

from __future__ import annotations

from genq.common import models
from genq.common.lua.compose import Fragment

PRIORITIES = Fragment(
    "priorities",
    ("PRI",),
    "local PRI = {" + ", ".join(f"'{p}'" for p in models.PRIORITIES) + "}\n",
)

LANES = Fragment(
    "lanes",
    ("QBASE", "BASE", "LANE", "lane_base", "use_lane", "model_ok", "lanes"),
    """
local QBASE = base_of_config(KEYS[1])
local BASE, LANE = QBASE, ''
local function lane_base(model)
  return model == '' and QBASE or key_lane(QBASE, model)
end
local function use_lane(stream)  -- the lane of a work stream becomes current
  BASE = lane_of_stream(stream)
  LANE = model_of_lane(BASE) or ''
end
local function model_ok(m)  -- models.py: MODEL_NAME_CHARS
  return type(m) == 'string' and #m >= 1 and #m <= 128
    and string.match(m, '^[A-Za-z0-9._/:@+%-]+$') ~= nil
end
local function lanes()  -- every lane's base: the unnamed one, then the named ones
  local out = {QBASE}
  for _, m in ipairs(redis.call('SMEMBERS', key_models(QBASE))) do
    table.insert(out, lane_base(m))
  end
  return out
end
""",
    (PRIORITIES,),
)
