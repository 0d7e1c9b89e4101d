"""The database's history as data: numbered SQL steps, each applied once by `Store.open`.

`MIGRATIONS[n - 1]` is version n. The store runs every step above the recorded version in one
transaction, under an advisory lock per PostgreSQL schema, and records each in `schema_version`
(simonw/llm's migrations.py is the model). A released step is never edited: a change is a new
step appended here plus the same change in `schema.sql`, the readable whole schema
(tests/test_migrations.py checks that both build the same database).

Steps use plain CREATE (no IF NOT EXISTS, no OR REPLACE): a step runs exactly once, so an object
that already exists is an error, and an audit trigger an admin disabled is never re-enabled.
Not handled: downgrades (a database newer than this code is refused, untouched).
"""
from __future__ import annotations

# Created (if missing) before the first step; one row per applied (or adopted) version.
VERSION_TABLE = """
CREATE TABLE IF NOT EXISTS schema_version (
    version    integer PRIMARY KEY,
    applied_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
"""

# Version 1: the schema as the unversioned code applied it at every start.
_INITIAL = """
CREATE TABLE pending_approvals (
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
CREATE UNIQUE INDEX pending_approvals_one_per_user ON pending_approvals (user_id) WHERE status = 'pending';
CREATE INDEX pending_approvals_created ON pending_approvals (created_at DESC);

CREATE TABLE audit_log (
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

CREATE FUNCTION audit_digest(r audit_log) RETURNS text LANGUAGE sql STABLE AS $$
    SELECT encode(sha256(convert_to(jsonb_build_array(
        r.prev_hash, r.id, extract(epoch FROM r.at)::text, r.event, r.user_id, r.skill_name,
        r.params, r.risk, r.approval_id, r.decision, r.exit_code, r.duration_ms, r.output_size,
        r.truncated, r.detail)::text, 'UTF8')), 'hex')
$$;

CREATE FUNCTION audit_chain() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(7308199101);
    NEW.id := nextval(pg_get_serial_sequence('audit_log', 'id'));
    NEW.at := clock_timestamp();
    NEW.prev_hash := coalesce((SELECT hash FROM audit_log ORDER BY id DESC LIMIT 1), '');
    NEW.hash := audit_digest(NEW);
    RETURN NEW;
END $$;

CREATE FUNCTION audit_refuse() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'audit_log is append-only (% refused)', TG_OP USING ERRCODE = 'insufficient_privilege';
END $$;

CREATE TRIGGER audit_log_chain BEFORE INSERT ON audit_log
    FOR EACH ROW EXECUTE FUNCTION audit_chain();
CREATE TRIGGER audit_log_append_only BEFORE UPDATE OR DELETE ON audit_log
    FOR EACH ROW EXECUTE FUNCTION audit_refuse();
CREATE TRIGGER audit_log_no_truncate BEFORE TRUNCATE ON audit_log
    FOR EACH STATEMENT EXECUTE FUNCTION audit_refuse();

CREATE TABLE messages (
    id      bigserial PRIMARY KEY,
    user_id text NOT NULL,
    at      timestamptz NOT NULL DEFAULT clock_timestamp(),
    message jsonb NOT NULL
);
CREATE INDEX messages_user ON messages (user_id, id DESC);

CREATE TABLE channel_state (
    channel    text NOT NULL,
    key        text NOT NULL,
    value      jsonb NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (channel, key)
);

CREATE TABLE seen_messages (
    channel    text NOT NULL,
    message_id text NOT NULL,
    at         timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (channel, message_id)
);

CREATE TABLE scheduled_tasks (
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
CREATE INDEX scheduled_tasks_due ON scheduled_tasks (next_run_at) WHERE enabled;

CREATE FUNCTION scheduled_tasks_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('ias_tasks', '');
    RETURN NULL;
END $$;
CREATE TRIGGER scheduled_tasks_changed AFTER INSERT OR UPDATE OR DELETE ON scheduled_tasks
    FOR EACH STATEMENT EXECUTE FUNCTION scheduled_tasks_notify();

CREATE TABLE task_runs (
    id          bigserial PRIMARY KEY,
    task_id     bigint NOT NULL REFERENCES scheduled_tasks (id) ON DELETE CASCADE,
    slot        timestamptz NOT NULL,
    started_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    finished_at timestamptz,
    status      text NOT NULL DEFAULT 'running' CHECK (status IN ('running', 'ok', 'error')),
    reply       text,
    error       text,
    UNIQUE (task_id, slot)
);
"""

# Version 2: the outbox (every message to the owner, written before it is delivered) and the
# delivery of each task run, recorded apart from its execution.
_OUTBOX = """
CREATE TABLE outbox (
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
    reason      text,
    next_try_at timestamptz,
    done_at     timestamptz,
    noticed     boolean NOT NULL DEFAULT false,
    task_run_id bigint REFERENCES task_runs (id) ON DELETE SET NULL
);
CREATE INDEX outbox_queued ON outbox (user_id, id) WHERE state = 'queued';
CREATE INDEX outbox_run ON outbox (task_run_id) WHERE task_run_id IS NOT NULL;

ALTER TABLE task_runs ADD COLUMN delivery text
    CHECK (delivery IN ('delivered', 'queued', 'fallback', 'expired'));
"""

# Version 3: the chain is computed and checked by iAs (an HMAC keyed with a key derived from the
# secret key, see auditchain.py), no longer by the database: whoever owns the tables could
# disable the trigger, edit a row and re-chain it with the database's own function. Older rows
# keep their SHA-256 values and are checked by the same rule, spelt out in the verifying query.
_KEYED_AUDIT = """
DROP TRIGGER audit_log_chain ON audit_log;
DROP FUNCTION audit_chain();
DROP FUNCTION audit_digest(audit_log);
"""

# Version 4: retention. The calls in flight (a skill_started row without its end), kept beside
# the log by a trigger on every insert, so a daemon start finds them without scanning the log;
# and the keyed checkpoint `ias audit --prune-before` leaves where it cut the log (one row:
# the last removed row's id and value, sealed with the chain key, see auditchain.py). The calls
# in flight are found with one pass over the log (grouped by call tag, whatever the plan).
_RETENTION = """
CREATE TABLE calls_in_flight (
    call     text PRIMARY KEY,
    audit_id bigint NOT NULL
);
INSERT INTO calls_in_flight (call, audit_id)
    SELECT detail, min(id) FROM audit_log
    WHERE event IN ('skill_started', 'skill_finished', 'skill_interrupted') AND detail LIKE 'call=%'
    GROUP BY detail HAVING bool_and(event = 'skill_started');
CREATE FUNCTION audit_calls_in_flight() RETURNS trigger LANGUAGE plpgsql AS $$
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
CREATE TRIGGER audit_log_calls AFTER INSERT ON audit_log
    FOR EACH ROW EXECUTE FUNCTION audit_calls_in_flight();

CREATE TABLE audit_checkpoint (
    one        boolean PRIMARY KEY DEFAULT true CHECK (one),
    last_id    bigint NOT NULL,
    last_value text NOT NULL,
    pruned     bigint NOT NULL,
    at         timestamptz NOT NULL DEFAULT clock_timestamp(),
    seal       text NOT NULL
);

CREATE INDEX messages_at ON messages (at);
CREATE INDEX outbox_done ON outbox (done_at) WHERE state <> 'queued';
CREATE INDEX task_runs_finished ON task_runs (finished_at) WHERE finished_at IS NOT NULL;
"""

# Version 5: every inbound message, recorded on arrival and marked done once its outcome is stored,
# so a restart, a SIGTERM or a database outage mid-turn leaves it pending, replayed at the next start.
# (A message id still goes into seen_messages, which keeps judging redeliveries.)
_INBOUND = """
CREATE TABLE inbound (
    id          bigserial PRIMARY KEY,
    channel     text NOT NULL,
    user_id     text NOT NULL,
    message_id  text,
    text        text NOT NULL,
    received_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    state       text NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'done')),
    done_at     timestamptz,
    replays     integer NOT NULL DEFAULT 0
);
CREATE INDEX inbound_pending ON inbound (id) WHERE state = 'pending';
CREATE INDEX inbound_done ON inbound (done_at) WHERE state = 'done';
"""

# Version 6: every model response's tokens, summed per user, Beijing day and model (SPEC §12 budgets);
# `updated_at` (the last response counted) is what retention prunes by.
_TOKEN_USAGE = """
CREATE TABLE token_usage (
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
"""

# Version 7: the files that came with an inbound message (their inbox records), so a replay keeps them.
_INBOUND_FILES = """
ALTER TABLE inbound ADD COLUMN attachments jsonb NOT NULL DEFAULT '[]';
"""

# Version 8: long-term memory (SPEC 14), facts kept per user with their provenance; every change of a row
# is committed with its audit row (store/memory.py).
_MEMORIES = """
CREATE TABLE memories (
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
CREATE INDEX memories_user ON memories (user_id, id);
"""

# Version 9 (media out, issue 26): a queued message may be a file a skill returned for the owner: the path of
# its private copy (ias/outgoing.py); `text` then names the file (what `ias outbox` shows).
_OUTBOX_FILES = """
ALTER TABLE outbox ADD COLUMN file_path text;
"""

# Version 10: grants (SPEC 12), each row keyed by iAs (`mac`), found by a keyed digest of user and skill
# (`lookup`).
_GRANTS = """
CREATE TABLE grants (
    id          bigint GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
    created_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    user_id     text NOT NULL,
    skill_name  text NOT NULL,
    params      jsonb NOT NULL,
    task_id     bigint REFERENCES scheduled_tasks (id) ON DELETE CASCADE,
    uses_max    integer CHECK (uses_max > 0),
    uses        integer NOT NULL DEFAULT 0,
    expires_at  timestamptz NOT NULL,
    approval_id uuid NOT NULL,
    lookup      text NOT NULL,
    mac         text NOT NULL,
    revoked_at  timestamptz
);
CREATE INDEX grants_lookup ON grants (lookup) WHERE revoked_at IS NULL;
CREATE INDEX grants_user ON grants (user_id, id) WHERE revoked_at IS NULL;
"""

MIGRATIONS: tuple[str, ...] = (_INITIAL, _OUTBOX, _KEYED_AUDIT, _RETENTION, _INBOUND, _TOKEN_USAGE, _INBOUND_FILES,
                                _MEMORIES, _OUTBOX_FILES, _GRANTS)
LATEST = len(MIGRATIONS)

# The tables version 1 creates. A schema holding all of them but no schema_version was built by
# the unversioned code (which applied schema.sql at every start): it is adopted as version 1.
INITIAL_TABLES = ("pending_approvals", "audit_log", "messages", "channel_state", "seen_messages",
                  "scheduled_tasks", "task_runs")
