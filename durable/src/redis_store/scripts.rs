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
//! 6. `dead`: HASH id → the dead letters of that id, oldest first: a MessagePack array
//!    of `{payload, "<attempt> <due ms>"}` (the id may die again once scheduled again).
//!
//! Time is the server's (`TIME`), so that consumers on machines with different clocks
//! agree on when a task is due and when a lease ran out. Redis 7 replicates the effects
//! of a script, not the script, so calling `TIME` before writing is allowed.

/// Helpers every script starts with.
macro_rules! prelude {
    () => {
        r#"
-- The server's clock in ms, rounded down, or up (a due time counted from it is then
-- never early).
local function now_ms(up)
  local t = redis.call('TIME')
  local round = up and math.ceil or math.floor
  return tonumber(t[1]) * 1000 + round(tonumber(t[2]) / 1000)
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

/// KEYS due lease task meta token; ARGV hint channel, shard, horizon ms, then triples
/// (id, payload, due ms). Schedules or replaces each task, from attempt 1; a lease on an
/// old version is dropped, so that version's ack is refused and cannot delete the new
/// one. If a task is due within the horizon, publishes `"<shard> <earliest due>"` on the
/// hint channel, so that the process that owns the shard arms it at once instead of at
/// its next fetch.
pub(crate) const SCHEDULE: &str = concat!(
    prelude!(),
    r#"
local soonest = nil
for i = 4, #ARGV, 3 do
  local id, p, d = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  redis.call('ZADD', KEYS[1], d, id)
  redis.call('ZREM', KEYS[2], id)
  redis.call('HSET', KEYS[3], id, p)
  redis.call('HSET', KEYS[4], id, '1 ' .. d)
  redis.call('HDEL', KEYS[5], id)
  d = tonumber(d)
  if soonest == nil or d < soonest then soonest = d end
end
if soonest ~= nil and soonest <= now_ms() + tonumber(ARGV[3]) then
  redis.call('PUBLISH', ARGV[1], ARGV[2] .. ' ' .. string.format('%d', soonest))
end
return (#ARGV - 3) / 3
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

/// KEYS due lease task meta token; ARGV visibility ms, limit, token base, number of
/// acks, then pairs (id, token) to ack, then the number of own claims, then pairs (id,
/// token) of the claims the caller holds in the shard. The one step of a handling
/// process on a shard: first acks each pair whose lease is still that token's (deleting
/// the task), then claims up to `limit` tasks, those whose lease ran out first, then
/// those due by the server's clock, the i-th under the token `<base>:<i>`. Returns
/// `{server now, acked, next, n, the server's microseconds past now, due, run out, then
/// n times (id, payload, attempt, due, lease expiry)}`: `acked` a string of `1`/`0` per
/// ack pair (`0`: refused, the lease was lost), `next` the earliest instant something
/// more may be claimable (a due time or a lease expiry; -1 if the shard is empty), `due`
/// and `run out` how many tasks left are due and how many leases have run out by now,
/// not counting the caller's own claims (tasks it runs, not tasks waiting).
pub(crate) const SWEEP: &str = concat!(
    prelude!(),
    r#"
local vis, limit, base, nacks = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3], tonumber(ARGV[4])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local acked = {}
for i = 0, nacks - 1 do
  local id, tok = ARGV[5 + 2 * i], ARGV[6 + 2 * i]
  if owned(KEYS[2], KEYS[5], id, tok, now) then
    redis.call('ZREM', KEYS[2], id)
    redis.call('HDEL', KEYS[3], id)
    redis.call('HDEL', KEYS[4], id)
    redis.call('HDEL', KEYS[5], id)
    acked[#acked + 1] = '1'
  else
    acked[#acked + 1] = '0'
  end
end
local out = {now, table.concat(acked), -1, 0, tonumber(t[2]) % 1000, 0, 0}
local n = 0
if limit > 0 then
  local ids = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'LIMIT', 0, limit)
  if #ids < limit then
    local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, limit - #ids)
    for _, id in ipairs(due) do ids[#ids + 1] = id end
  end
  for _, id in ipairs(ids) do
    n = n + 1
    local r = lease_it(id, base .. ':' .. n, vis, now)
    out[#out + 1] = id
    for j = 2, 5 do out[#out + 1] = r[j] end
  end
end
out[4] = n
local wake = -1
local d = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
if #d > 0 then wake = math.floor(tonumber(d[2])) end
local l = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
if #l > 0 and (wake < 0 or tonumber(l[2]) < wake) then wake = math.floor(tonumber(l[2])) end
out[3] = wake
out[6] = redis.call('ZCOUNT', KEYS[1], '-inf', now)
local run_out = redis.call('ZCOUNT', KEYS[2], '-inf', now)
local at = 5 + 2 * nacks
for i = 0, tonumber(ARGV[at]) - 1 do
  local id, tok = ARGV[at + 1 + 2 * i], ARGV[at + 2 + 2 * i]
  local expiry = redis.call('ZSCORE', KEYS[2], id)
  if expiry and tonumber(expiry) <= now and redis.call('HGET', KEYS[5], id) == tok then
    run_out = run_out - 1
  end
end
out[7] = run_out
return out
"#
);

/// KEYS members; ARGV member id, time to live ms. Registers (or keeps alive) a handling
/// process, drops those whose heartbeat lapsed by the server's clock, and returns the
/// live members. Its key has the queue's own hash tag, apart from every shard's.
pub(crate) const HEARTBEAT: &str = concat!(
    prelude!(),
    r#"
local now = now_ms()
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
return redis.call('ZRANGE', KEYS[1], 0, -1)
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

/// KEYS due lease task meta token dead; ARGV id, token, backoff ms, max
/// attempts, hint channel, shard, horizon ms. If the lease is still held: the task goes
/// back among the pending, due after the backoff with the next attempt number (1), or
/// becomes a dead letter once it has had `max attempts` (2). Else 0 and nothing changes.
/// A retry due within the horizon is hinted as [`SCHEDULE`] does, so the shard's owner
/// arms it even when another process (a hand-written consumer) failed it.
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
  local old = redis.call('HGET', KEYS[6], id)
  local letters = old and cmsgpack.unpack(old) or {}
  letters[#letters + 1] = {redis.call('HGET', KEYS[3], id) or '', a .. ' ' .. d}
  redis.call('HSET', KEYS[6], id, cmsgpack.pack(letters))
  redis.call('HDEL', KEYS[3], id)
  redis.call('HDEL', KEYS[4], id)
  return 2
end
local next_due = now_ms(true) + tonumber(ARGV[3])
redis.call('ZADD', KEYS[1], next_due, id)
redis.call('HSET', KEYS[4], id, (a + 1) .. ' ' .. next_due)
if tonumber(ARGV[3]) <= tonumber(ARGV[7]) then
  redis.call('PUBLISH', ARGV[5], ARGV[6] .. ' ' .. string.format('%d', next_due))
end
return 1
"#
);

/// KEYS due lease task meta token dead; ARGV id, hint channel, shard. Moves the newest
/// dead letter of `id` back among the pending, due now, from attempt 1 (replacing a task
/// of that id), and hints it as [`SCHEDULE`] does: 1; or 0 if there is no such dead
/// letter.
pub(crate) const REQUEUE: &str = concat!(
    prelude!(),
    r#"
local id = ARGV[1]
local old = redis.call('HGET', KEYS[6], id)
if not old then return 0 end
local letters = cmsgpack.unpack(old)
local p = letters[#letters][1]
letters[#letters] = nil
if #letters == 0 then
  redis.call('HDEL', KEYS[6], id)
else
  redis.call('HSET', KEYS[6], id, cmsgpack.pack(letters))
end
local now = now_ms()
redis.call('ZADD', KEYS[1], now, id)
redis.call('ZREM', KEYS[2], id)
redis.call('HSET', KEYS[3], id, p)
redis.call('HSET', KEYS[4], id, '1 ' .. now)
redis.call('HDEL', KEYS[5], id)
redis.call('PUBLISH', ARGV[2], ARGV[3] .. ' ' .. string.format('%d', now))
return 1
"#
);

/// KEYS dead. Every dead letter of the shard, flat: id, payload, `"<attempt> <due ms>"`,
/// then the next.
pub(crate) const DEAD_LETTERS: &str = r#"
local all = redis.call('HGETALL', KEYS[1])
local out = {}
for i = 1, #all, 2 do
  for _, letter in ipairs(cmsgpack.unpack(all[i + 1])) do
    out[#out + 1] = all[i]
    out[#out + 1] = letter[1]
    out[#out + 1] = letter[2]
  end
end
return out
"#;
