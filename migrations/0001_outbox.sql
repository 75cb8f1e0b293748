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
-- The poll source's trigger that keeps unpublished rows (0002_poll.sql),
-- left from a move to the WAL source, would skip the deletes of the
-- delete-after-insert mode.
DROP TRIGGER IF EXISTS {{.KeepTrigger}} ON {{.Table}};
