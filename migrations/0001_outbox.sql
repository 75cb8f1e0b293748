-- The default outbox table, in the shape Debezium's Outbox Event Router
-- expects. Applications insert one row per event in the same transaction as
-- their business change; they may delete it again in that transaction so the
-- table stays empty (the WAL still carries the insert).
CREATE TABLE IF NOT EXISTS {{.Table}} (
    id            uuid         PRIMARY KEY,
    aggregatetype varchar(255) NOT NULL,
    aggregateid   varchar(255) NOT NULL,
    type          varchar(255) NOT NULL,
    payload       jsonb,
    created_at    timestamptz  NOT NULL DEFAULT now()
);
-- The poll source's triggers that keep unpublished rows (0002_poll.sql),
-- left from a move to the WAL source, would skip the deletes of the
-- delete-after-insert mode. Dropped only when there: DROP TRIGGER locks
-- the table even when there is nothing to drop.
DO $pgoutbox$
DECLARE
    t text;
BEGIN
    FOR t IN SELECT tgname FROM pg_trigger WHERE tgrelid = to_regclass($t${{.Table}}$t$)
        AND tgname IN ($t${{.KeepTriggerName}}$t$, $t${{.KeepTriggerName}}_truncate$t$)
    LOOP
        EXECUTE format('DROP TRIGGER %I ON %s', t, $t${{.Table}}$t$);
    END LOOP;
END
$pgoutbox$;
