//! The Lua scripts: every step on the server is one script, so it is atomic there.
//!
//! Every script touches the keys of one shard only (all share the hash tag `{queue:S}`),
//! so each runs on one node of a Redis Cluster. Keys, in the order the scripts take them:
//!
//! 1. `due`: ZSET id → due time (ms). A task is here while pending and not leased.
//! 2. `lease`: ZSET id → lease expiry (ms, server time). A task is here while claimed.
//! 3. `task`: HASH id → payload.
//! 4. `meta`: HASH id → `"<attempt> <due ms>"`.
//! 5. `token`: HASH id → the lease token of the claim that holds it.
//! 6. `dead`: HASH id → payload of a dead letter.
//! 7. `deadmeta`: HASH id → `"<attempt> <due ms>"` of a dead letter.
//!
//! Time is the server's (`TIME`), so that consumers on machines with different clocks
//! agree on when a task is due and when a lease ran out. Redis 7 replicates the effects
//! of a script, not the script, so calling `TIME` before writing is allowed.

/// Helpers every script starts with.
macro_rules! prelude {
    () => {
        r#"
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
-- Whether the claim with `tok` still holds `id`: the token matches and the lease has
-- not run out by the server's clock.
local function owned(lease, token, id, tok, now)
  if redis.call('HGET', token, id) ~= tok then return false end
  local l = redis.call('ZSCORE', lease, id)
  return l ~= false and tonumber(l) > now
end
-- Leases `id` to `tok` until now + vis and returns {1, payload, attempt, due, until}.
local function lease_it(id, tok, vis, now)
  redis.call('ZREM', KEYS[1], id)
  redis.call('ZADD', KEYS[2], now + vis, id)
  redis.call('HSET', KEYS[5], id, tok)
  local a, d = string.match(redis.call('HGET', KEYS[4], id) or '1 0', '^(%d+) (%d+)$')
  return {1, redis.call('HGET', KEYS[3], id) or '', tonumber(a), tonumber(d), now + vis}
end
"#
    };
}

/// KEYS due lease task meta token; ARGV triples (id, payload, due ms). Schedules or
/// replaces each task, from attempt 1; a lease on an old version is dropped, so that
/// version's ack is refused and cannot delete the new one.
pub(crate) const SCHEDULE: &str = concat!(
    prelude!(),
    r#"
for i = 1, #ARGV, 3 do
  local id, p, d = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  redis.call('ZADD', KEYS[1], d, id)
  redis.call('ZREM', KEYS[2], id)
  redis.call('HSET', KEYS[3], id, p)
  redis.call('HSET', KEYS[4], id, '1 ' .. d)
  redis.call('HDEL', KEYS[5], id)
end
return #ARGV / 3
"#
);

/// KEYS due lease task meta token; ARGV id. Removes the task, pending or leased; returns
/// 1 if there was one.
pub(crate) const CANCEL: &str = concat!(
    prelude!(),
    r#"
local id = ARGV[1]
local n = redis.call('ZREM', KEYS[1], id) + redis.call('ZREM', KEYS[2], id)
redis.call('HDEL', KEYS[3], id)
redis.call('HDEL', KEYS[4], id)
redis.call('HDEL', KEYS[5], id)
if n > 0 then return 1 end
return 0
"#
);

/// KEYS due lease task meta token; ARGV ahead ms, limit. Puts tasks whose lease ran out
/// back among the pending (with their due time, so they come first), then returns
/// `{server now, id, due, id, due, ...}` for at most `limit` tasks due by now + ahead.
pub(crate) const FETCH: &str = concat!(
    prelude!(),
    r#"
local now = now_ms()
local limit = tonumber(ARGV[2])
local expired = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'LIMIT', 0, limit)
for _, id in ipairs(expired) do
  local _, d = string.match(redis.call('HGET', KEYS[4], id) or '', '^(%d+) (%d+)$')
  redis.call('ZREM', KEYS[2], id)
  redis.call('HDEL', KEYS[5], id)
  redis.call('ZADD', KEYS[1], tonumber(d) or now, id)
end
local out = {now}
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now + tonumber(ARGV[1]),
  'WITHSCORES', 'LIMIT', 0, limit)
for i = 1, #due, 2 do
  out[#out + 1] = due[i]
  out[#out + 1] = math.floor(tonumber(due[i + 1]))
end
return out
"#
);

/// KEYS due lease task meta token; ARGV id, token, visibility ms. Claims `id` if it is
/// due by the server's clock and not leased (or its lease ran out): `{1, payload,
/// attempt, due,
/// lease expiry}`; `{-1, ms}` if it is due only in `ms`; `{0}` if it is gone or held.
pub(crate) const CLAIM: &str = concat!(
    prelude!(),
    r#"
local id, tok, vis = ARGV[1], ARGV[2], tonumber(ARGV[3])
local now = now_ms()
local d = redis.call('ZSCORE', KEYS[1], id)
if d then
  d = tonumber(d)
  if d > now then return {-1, d - now} end
  return lease_it(id, tok, vis, now)
end
local l = redis.call('ZSCORE', KEYS[2], id)
if l and tonumber(l) <= now then return lease_it(id, tok, vis, now) end
return {0}
"#
);

/// KEYS due lease task meta token; ARGV token, visibility ms. Claims the oldest task
/// whose lease ran out, or else the oldest due task: `{1, payload, attempt, due, lease
/// expiry, id}`,
/// or `{0}` if none is due. The polling consumer's step.
pub(crate) const CLAIM_NEXT: &str = concat!(
    prelude!(),
    r#"
local tok, vis = ARGV[1], tonumber(ARGV[2])
local now = now_ms()
local ids = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'LIMIT', 0, 1)
if #ids == 0 then
  ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, 1)
end
if #ids == 0 then return {0} end
local r = lease_it(ids[1], tok, vis, now)
r[6] = ids[1]
return r
"#
);

/// KEYS lease token; ARGV id, token, visibility ms. Extends a lease still held: returns
/// the new expiry, or 0 if the lease was lost.
pub(crate) const RENEW: &str = concat!(
    prelude!(),
    r#"
local id, tok = ARGV[1], ARGV[2]
local now = now_ms()
if not owned(KEYS[1], KEYS[2], id, tok, now) then return 0 end
local until_ms = now + tonumber(ARGV[3])
redis.call('ZADD', KEYS[1], 'XX', until_ms, id)
return until_ms
"#
);

/// KEYS due lease task meta token; ARGV id, token. Deletes the task if the lease is still
/// held: 1; else 0 and nothing changes.
pub(crate) const ACK: &str = concat!(
    prelude!(),
    r#"
local id, tok = ARGV[1], ARGV[2]
if not owned(KEYS[2], KEYS[5], id, tok, now_ms()) then return 0 end
redis.call('ZREM', KEYS[2], id)
redis.call('HDEL', KEYS[3], id)
redis.call('HDEL', KEYS[4], id)
redis.call('HDEL', KEYS[5], id)
return 1
"#
);

/// KEYS due lease task meta token dead deadmeta; ARGV id, token, backoff ms, max
/// attempts. If the lease is still held: the task goes back among the pending, due after
/// the backoff with the next attempt number (1), or becomes a dead letter once it has had
/// `max attempts` (2). Else 0 and nothing changes.
pub(crate) const FAIL: &str = concat!(
    prelude!(),
    r#"
local id, tok = ARGV[1], ARGV[2]
local now = now_ms()
if not owned(KEYS[2], KEYS[5], id, tok, now) then return 0 end
local a, d = string.match(redis.call('HGET', KEYS[4], id) or '1 0', '^(%d+) (%d+)$')
a = tonumber(a)
redis.call('ZREM', KEYS[2], id)
redis.call('HDEL', KEYS[5], id)
if a >= tonumber(ARGV[4]) then
  redis.call('HSET', KEYS[6], id, redis.call('HGET', KEYS[3], id) or '')
  redis.call('HSET', KEYS[7], id, a .. ' ' .. d)
  redis.call('HDEL', KEYS[3], id)
  redis.call('HDEL', KEYS[4], id)
  return 2
end
local next_due = now + tonumber(ARGV[3])
redis.call('ZADD', KEYS[1], next_due, id)
redis.call('HSET', KEYS[4], id, (a + 1) .. ' ' .. next_due)
return 1
"#
);

/// KEYS due lease task meta token dead deadmeta; ARGV id. Moves a dead letter back among
/// the pending, due now, from attempt 1 (replacing a task of that id): 1; or 0 if there
/// is no such dead letter.
pub(crate) const REQUEUE: &str = concat!(
    prelude!(),
    r#"
local id = ARGV[1]
local p = redis.call('HGET', KEYS[6], id)
if not p then return 0 end
local now = now_ms()
redis.call('ZADD', KEYS[1], now, id)
redis.call('ZREM', KEYS[2], id)
redis.call('HSET', KEYS[3], id, p)
redis.call('HSET', KEYS[4], id, '1 ' .. now)
redis.call('HDEL', KEYS[5], id)
redis.call('HDEL', KEYS[6], id)
redis.call('HDEL', KEYS[7], id)
return 1
"#
);
