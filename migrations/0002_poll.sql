-- The poll source's outbox table: Debezium's outbox columns (so the router
-- options and pkg/outbox work unchanged) and the poll source's own. Every
-- statement is idempotent, and on an existing outbox table (the WAL
-- source's, say) it adds what is missing: existing rows get a sequence
-- number, published_at NULL and no attempts.
CREATE TABLE IF NOT EXISTS {{.Table}} (
    id            uuid         PRIMARY KEY,
    aggregatetype varchar(255) NOT NULL,
    aggregateid   varchar(255) NOT NULL,
    type          varchar(255) NOT NULL,
    payload       jsonb,
    created_at    timestamptz  NOT NULL DEFAULT now(),
    -- The order rows are claimed in. A row whose transaction commits after
    -- rows with higher numbers is still claimed: claims start at the lowest
    -- unpublished number every time.
    seq           bigint       GENERATED ALWAYS AS IDENTITY,
    -- NULL until Kafka acknowledged the row's record.
    published_at  timestamptz,
    -- Failed attempts to publish the row (retriable broker errors do not
    -- count), and why the last one failed.
    attempts      integer      NOT NULL DEFAULT 0,
    last_error    text
);
-- The statements below that lock the table (ALTER TABLE and CREATE
-- TRIGGER take locks that conflict with INSERT, and CREATE INDEX one that
-- does even when the index exists) run only for what the catalog shows
-- missing or different, so a migrate of a table that has it all takes no
-- lock that an application's INSERT waits for; those that run wait for
-- their lock at most lock_timeout (migrate --lock-timeout), a bounded
-- number of times. --print shows them all.
{{if .Plan.CreatedAt}}ALTER TABLE {{.Table}} ADD COLUMN IF NOT EXISTS created_at timestamptz NOT NULL DEFAULT now();
{{end}}{{if .Plan.Seq}}ALTER TABLE {{.Table}} ADD COLUMN IF NOT EXISTS seq bigint GENERATED ALWAYS AS IDENTITY;
{{end}}{{if .Plan.PublishedAt}}ALTER TABLE {{.Table}} ADD COLUMN IF NOT EXISTS published_at timestamptz;
{{end}}{{if .Plan.Attempts}}ALTER TABLE {{.Table}} ADD COLUMN IF NOT EXISTS attempts integer NOT NULL DEFAULT 0;
{{end}}{{if .Plan.LastError}}ALTER TABLE {{.Table}} ADD COLUMN IF NOT EXISTS last_error text;
{{end}}-- The claim's index: the unpublished rows in sequence order. Published
-- rows leave it, so it stays small however many the table keeps.
{{if .Plan.UnpublishedIndex}}CREATE INDEX IF NOT EXISTS {{.UnpublishedIndex}} ON {{.Table}} (seq) WHERE published_at IS NULL;
{{end}}-- Cleanup's index: the published rows by age.
{{if .Plan.PublishedIndex}}CREATE INDEX IF NOT EXISTS {{.PublishedIndex}} ON {{.Table}} (published_at) WHERE published_at IS NOT NULL;
{{end}}-- Unpublished rows stay until they are published: a writer that deletes
-- its row in its own transaction (the WAL source's delete-after-insert
-- mode) would leave nothing for the poll source to read, and its event
-- would be lost without a word. Such a delete is skipped, with a warning,
-- and the poll source publishes the row. The relay's own deletes
-- (poll.on.publish: delete), and a purge meant as one, set
-- pgoutbox.delete_unpublished = on first. pgoutbox migrate with the WAL
-- source drops the trigger.
CREATE OR REPLACE FUNCTION {{.KeepFunction}}() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF coalesce(current_setting('pgoutbox.delete_unpublished', true), '') = 'on' THEN
        RETURN OLD;
    END IF;
    RAISE WARNING 'pgoutbox: a row of % is not published yet: the delete is skipped, and the poll source publishes it (SET pgoutbox.delete_unpublished = on to delete it anyway)', TG_TABLE_NAME;
    RETURN NULL;
END
$$;
{{if .Plan.KeepTrigger}}CREATE OR REPLACE TRIGGER {{.KeepTrigger}} BEFORE DELETE ON {{.Table}}
    FOR EACH ROW WHEN (OLD.published_at IS NULL) EXECUTE FUNCTION {{.KeepFunction}}();
{{end}}-- ALWAYS: a trigger fires by default only in sessions whose
-- session_replication_role is origin, and one set to replica (a
-- superuser's, pg_restore --disable-triggers, a logical replication apply
-- worker writing into the table, pglogical) would delete unpublished rows
-- unchecked. CREATE OR REPLACE TRIGGER makes it fire in origin mode again.
{{if or .Plan.KeepTrigger .Plan.KeepAlways}}ALTER TABLE {{.Table}} ENABLE ALWAYS TRIGGER {{.KeepTrigger}};
{{end}}-- TRUNCATE fires no row trigger: one of the table (not of a partition on
-- its own) is refused while it holds unpublished rows.
CREATE OR REPLACE FUNCTION {{.KeepTruncateFunction}}() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    unpublished boolean;
BEGIN
    IF coalesce(current_setting('pgoutbox.delete_unpublished', true), '') = 'on' THEN
        RETURN NULL;
    END IF;
    EXECUTE format('SELECT EXISTS (SELECT 1 FROM %s WHERE published_at IS NULL)', TG_RELID::regclass) INTO unpublished;
    IF unpublished THEN
        RAISE EXCEPTION 'pgoutbox: % holds rows not published yet: TRUNCATE would discard their events', TG_RELID::regclass
            USING HINT = 'let the poll source publish them, or SET pgoutbox.delete_unpublished = on to discard them anyway';
    END IF;
    RETURN NULL;
END
$$;
{{if .Plan.KeepTruncateTrigger}}CREATE OR REPLACE TRIGGER {{.KeepTruncateTrigger}} BEFORE TRUNCATE ON {{.Table}}
    FOR EACH STATEMENT EXECUTE FUNCTION {{.KeepTruncateFunction}}();
{{end}}{{if or .Plan.KeepTruncateTrigger .Plan.KeepTruncateAlways}}ALTER TABLE {{.Table}} ENABLE ALWAYS TRIGGER {{.KeepTruncateTrigger}};
{{end}}
