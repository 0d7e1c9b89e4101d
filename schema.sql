-- iAs schema, the readable whole at the latest version. iAs itself builds and upgrades a database
-- with the numbered steps in ias/migrations.py (recorded in schema_version, applied once under an
-- advisory lock); tests/test_migrations.py checks that both give the same database. Applied by
-- hand to an empty schema, this file builds a current database. Needs PostgreSQL >= 14.

-- The migrations applied to this schema (one row per version; ias/migrations.py).
CREATE TABLE IF NOT EXISTS schema_version (
    version    integer PRIMARY KEY,
    applied_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
INSERT INTO schema_version (version) VALUES (1), (2), (3), (4), (5), (6), (7), (8), (9), (10) ON CONFLICT DO NOTHING;

-- Approvals of High-risk calls (the seed's table, exactly these columns).
CREATE TABLE IF NOT EXISTS pending_approvals (
    id            uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    created_at    timestamptz NOT NULL DEFAULT clock_timestamp(),
    expires_at    timestamptz NOT NULL,
    user_id       text NOT NULL,
    skill_name    text NOT NULL,
    params        jsonb NOT NULL,
    code_hash     text NOT NULL,
    attempts_left integer NOT NULL DEFAULT 3,
    status        text NOT NULL DEFAULT 'pending'
                  CHECK (status IN ('pending', 'approved', 'rejected', 'expired')),
    result        jsonb,
    consumed_at   timestamptz
);
-- At most one pending approval per user.
CREATE UNIQUE INDEX IF NOT EXISTS pending_approvals_one_per_user
    ON pending_approvals (user_id) WHERE status = 'pending';
CREATE INDEX IF NOT EXISTS pending_approvals_created ON pending_approvals (created_at DESC);

-- Audit log: append-only. iAs chains every row to the previous one with an HMAC-SHA256 keyed
-- with a key derived from the secret key, which the database never sees (`hash` = 'k1:' + hex;
-- rows from before that hold a bare SHA-256 of the row, see ias/auditchain.py and
-- ias/store.py). Nothing here computes or checks the chain: the database is not trusted to.
CREATE TABLE IF NOT EXISTS audit_log (
    id          bigserial PRIMARY KEY,
    at          timestamptz NOT NULL DEFAULT clock_timestamp(),
    event       text NOT NULL,
    user_id     text,
    skill_name  text,
    params      jsonb,
    risk        text,
    approval_id uuid,
    decision    text,
    exit_code   integer,
    duration_ms integer,
    output_size bigint,
    truncated   boolean,
    detail      text,
    prev_hash   text NOT NULL,
    hash        text NOT NULL
);

CREATE OR REPLACE FUNCTION audit_refuse() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'audit_log is append-only (% refused)', TG_OP USING ERRCODE = 'insufficient_privilege';
END $$;

CREATE OR REPLACE TRIGGER audit_log_append_only BEFORE UPDATE OR DELETE ON audit_log
    FOR EACH ROW EXECUTE FUNCTION audit_refuse();
CREATE OR REPLACE TRIGGER audit_log_no_truncate BEFORE TRUNCATE ON audit_log
    FOR EACH STATEMENT EXECUTE FUNCTION audit_refuse();

-- The calls in flight: a skill_started row whose call tag no skill_finished or skill_interrupted
-- row shares yet. Kept by a trigger in the transaction of each such row (bookkeeping only: the
-- log stays the record), so a daemon start finds the interrupted calls without scanning the log.
CREATE TABLE IF NOT EXISTS calls_in_flight (
    call     text PRIMARY KEY,
    audit_id bigint NOT NULL
);

CREATE OR REPLACE FUNCTION audit_calls_in_flight() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.detail LIKE 'call=%' THEN
        IF NEW.event = 'skill_started' THEN
            INSERT INTO calls_in_flight (call, audit_id) VALUES (NEW.detail, NEW.id) ON CONFLICT DO NOTHING;
        ELSIF NEW.event IN ('skill_finished', 'skill_interrupted') THEN
            DELETE FROM calls_in_flight WHERE call = NEW.detail;
        END IF;
    END IF;
    RETURN NULL;
END $$;
CREATE OR REPLACE TRIGGER audit_log_calls AFTER INSERT ON audit_log
    FOR EACH ROW EXECUTE FUNCTION audit_calls_in_flight();

-- Where `ias audit --prune-before` cut the log (one row): the last removed row's id and value,
-- the rows removed so far, sealed with the chain key (ias/auditchain.py). `--verify` starts from
-- it; without the key it cannot be forged.
CREATE TABLE IF NOT EXISTS audit_checkpoint (
    one        boolean PRIMARY KEY DEFAULT true CHECK (one),
    last_id    bigint NOT NULL,
    last_value text NOT NULL,
    pruned     bigint NOT NULL,
    at         timestamptz NOT NULL DEFAULT clock_timestamp(),
    seal       text NOT NULL
);

-- Conversation history per user (one row per chat message sent to or received from the model).
CREATE TABLE IF NOT EXISTS messages (
    id      bigserial PRIMARY KEY,
    user_id text NOT NULL,
    at      timestamptz NOT NULL DEFAULT clock_timestamp(),
    message jsonb NOT NULL
);
CREATE INDEX IF NOT EXISTS messages_user ON messages (user_id, id DESC);
CREATE INDEX IF NOT EXISTS messages_at ON messages (at);          -- retention

-- Channel state: WeChat token, cursor, context tokens … (one JSON value per key).
CREATE TABLE IF NOT EXISTS channel_state (
    channel    text NOT NULL,
    key        text NOT NULL,
    value      jsonb NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (channel, key)
);

-- Inbound message ids already handled, so a redelivery (also after a restart) is ignored.
CREATE TABLE IF NOT EXISTS seen_messages (
    channel    text NOT NULL,
    message_id text NOT NULL,
    at         timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (channel, message_id)
);

-- Scheduled tasks and their runs; a run row per (task, slot) claims the slot exactly once.
CREATE TABLE IF NOT EXISTS scheduled_tasks (
    id          bigserial PRIMARY KEY,
    user_id     text NOT NULL,
    name        text NOT NULL,
    schedule    text NOT NULL,
    kind        text NOT NULL CHECK (kind IN ('reminder', 'prompt')),
    text        text NOT NULL,
    enabled     boolean NOT NULL DEFAULT true,
    next_run_at timestamptz,
    created_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    updated_at  timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX IF NOT EXISTS scheduled_tasks_due ON scheduled_tasks (next_run_at) WHERE enabled;

-- Wakes the daemon's scheduler when a task changes (also when `ias tasks` runs in another process).
CREATE OR REPLACE FUNCTION scheduled_tasks_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('ias_tasks', '');
    RETURN NULL;
END $$;
CREATE OR REPLACE TRIGGER scheduled_tasks_changed AFTER INSERT OR UPDATE OR DELETE ON scheduled_tasks
    FOR EACH STATEMENT EXECUTE FUNCTION scheduled_tasks_notify();

CREATE TABLE IF NOT EXISTS task_runs (
    id          bigserial PRIMARY KEY,
    task_id     bigint NOT NULL REFERENCES scheduled_tasks (id) ON DELETE CASCADE,
    slot        timestamptz NOT NULL,
    started_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    finished_at timestamptz,
    status      text NOT NULL DEFAULT 'running' CHECK (status IN ('running', 'ok', 'error')),
    reply       text,
    error       text,
    UNIQUE (task_id, slot),
    -- how its message reached the owner, apart from how it ran (NULL: nothing to deliver yet)
    delivery    text CHECK (delivery IN ('delivered', 'queued', 'fallback', 'expired'))
);

-- Every message to the owner, written before it is delivered: queued -> sent | fallback | expired.
-- One row per part (a long text is split), each with the client_id it is always sent with, so a
-- part is never sent twice across restarts. Confirmation codes never enter this table.
CREATE TABLE IF NOT EXISTS outbox (
    id          bigserial PRIMARY KEY,
    user_id     text NOT NULL,
    channel     text NOT NULL,
    kind        text NOT NULL CHECK (kind IN ('reply', 'reminder', 'task', 'notice')),
    text        text NOT NULL,
    client_id   text NOT NULL UNIQUE,
    created_at  timestamptz NOT NULL,
    due_at      timestamptz NOT NULL,
    state       text NOT NULL DEFAULT 'queued' CHECK (state IN ('queued', 'sent', 'fallback', 'expired')),
    attempts    integer NOT NULL DEFAULT 0,
    reason      text,                           -- why it waits (window, budget, error …) or how it ended
    next_try_at timestamptz,                    -- after a transient error: not before then
    done_at     timestamptz,
    noticed     boolean NOT NULL DEFAULT false, -- expired, and the owner was told so
    task_run_id bigint REFERENCES task_runs (id) ON DELETE SET NULL
);
CREATE INDEX IF NOT EXISTS outbox_queued ON outbox (user_id, id) WHERE state = 'queued';
CREATE INDEX IF NOT EXISTS outbox_run ON outbox (task_run_id) WHERE task_run_id IS NOT NULL;
-- Retention: settled messages and finished runs by age.
CREATE INDEX IF NOT EXISTS outbox_done ON outbox (done_at) WHERE state <> 'queued';
CREATE INDEX IF NOT EXISTS task_runs_finished ON task_runs (finished_at) WHERE finished_at IS NOT NULL;

-- Every inbound message, recorded on arrival: pending until its outcome (a reply queued in the outbox,
-- or an approval reply applied) is stored, then done. What is still pending at a start is handled
-- then, in order, before anything new from that user.
CREATE TABLE IF NOT EXISTS inbound (
    id          bigserial PRIMARY KEY,
    channel     text NOT NULL,
    user_id     text NOT NULL,
    message_id  text,                           -- the channel's id, when it has one (also in seen_messages)
    text        text NOT NULL,
    received_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    state       text NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'done')),
    done_at     timestamptz,
    replays     integer NOT NULL DEFAULT 0      -- starts that handled it again (given up past a limit)
);
CREATE INDEX IF NOT EXISTS inbound_pending ON inbound (id) WHERE state = 'pending';
CREATE INDEX IF NOT EXISTS inbound_done ON inbound (done_at) WHERE state = 'done';

-- Model tokens per user, Beijing day and model: one row each, summed by UPSERT after every model
-- response (estimated_requests: responses without a believable `usage`, counted by estimate).
-- Pruned with the history by updated_at, the last response counted.
CREATE TABLE IF NOT EXISTS token_usage (
    id                 bigserial PRIMARY KEY,
    day                date NOT NULL,
    user_id            text NOT NULL,
    model              text NOT NULL,
    prompt_tokens      bigint NOT NULL CHECK (prompt_tokens >= 0),
    completion_tokens  bigint NOT NULL CHECK (completion_tokens >= 0),
    requests           integer NOT NULL CHECK (requests >= 0),
    estimated_requests integer NOT NULL CHECK (estimated_requests >= 0),
    updated_at         timestamptz NOT NULL DEFAULT clock_timestamp(),
    UNIQUE (day, user_id, model)
);

-- The files that came with an inbound message: their inbox records ({"path", "kind", "mime", "size", "name"}),
-- so a message replayed after a restart keeps them.
ALTER TABLE inbound ADD COLUMN IF NOT EXISTS attachments jsonb NOT NULL DEFAULT '[]';

-- Long-term memory (SPEC 14): short facts per user with their provenance. `source`: said by the owner or
-- written by the model; `said`: the owner's message of the turn it came from; `tainted`: that turn had
-- read untrusted content (web, mail, files, MCP results) first, so the memory is `unverified` and unused
-- until the owner confirms it (`/memory ok N`). Each change commits with its audit row.
CREATE TABLE IF NOT EXISTS memories (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    user_id      text NOT NULL,
    text         text NOT NULL CHECK (char_length(text) BETWEEN 1 AND 500),
    source       text NOT NULL CHECK (source IN ('owner', 'model')),
    status       text NOT NULL CHECK (status IN ('active', 'unverified')),
    tainted      boolean NOT NULL,
    said         text,
    created_at   timestamptz NOT NULL DEFAULT clock_timestamp(),
    confirmed_at timestamptz
);
CREATE INDEX IF NOT EXISTS memories_user ON memories (user_id, id);

-- Media out (issue 26): a queued message may be a file a skill returned for the owner, sent through the
-- channel's file upload: the path of its private copy under $IAS_DATA_DIR/outgoing (`text` names the file).
ALTER TABLE outbox ADD COLUMN IF NOT EXISTS file_path text;

-- Grants (SPEC 12): an approval whose code carried `+1h`, `+1d` or `+N次` lets later calls of the same
-- user, skill and parameters (and, with task_id, only that task's calls) run without a new code. The
-- row is only data: `mac` (HMAC keyed with a key derived from the secret key, computed by iAs over
-- id, user, skill, params, task, uses_max, expires_at and approval) decides whether it counts, so a
-- writer can end or spoil a grant but never mint or widen one. `lookup` is a keyed digest of
-- (user, skill): with the params (compared as jsonb text), how a call finds its candidates.
CREATE TABLE IF NOT EXISTS grants (
    id          bigint GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
    created_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    user_id     text NOT NULL,
    skill_name  text NOT NULL,
    params      jsonb NOT NULL,
    task_id     bigint REFERENCES scheduled_tasks (id) ON DELETE CASCADE,   -- null: any call of the user
    uses_max    integer CHECK (uses_max > 0),                               -- null: a time grant
    uses        integer NOT NULL DEFAULT 0,
    expires_at  timestamptz NOT NULL,
    approval_id uuid NOT NULL,
    lookup      text NOT NULL,
    mac         text NOT NULL,
    revoked_at  timestamptz
);
CREATE INDEX IF NOT EXISTS grants_lookup ON grants (lookup) WHERE revoked_at IS NULL;
CREATE INDEX IF NOT EXISTS grants_user ON grants (user_id, id) WHERE revoked_at IS NULL;
