-- The default outbox table, in the shape Debezium's Outbox Event Router
-- expects, and the publication pgoutbox streams from.
--
-- Applications insert one row per event in the same transaction as their
-- business change; they may delete it again in that transaction so the table
-- stays empty (the WAL still carries the insert).
CREATE TABLE IF NOT EXISTS {{.Table}} (
    id            uuid         PRIMARY KEY,
    aggregatetype varchar(255) NOT NULL,
    aggregateid   varchar(255) NOT NULL,
    type          varchar(255) NOT NULL,
    payload       jsonb,
    created_at    timestamptz  NOT NULL DEFAULT now()
);

DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = {{.PublicationLiteral}}) THEN
        CREATE PUBLICATION {{.Publication}} FOR TABLE {{.Table}} WITH (publish = 'insert');
    ELSIF NOT EXISTS (
        SELECT 1 FROM pg_publication p
        WHERE p.pubname = {{.PublicationLiteral}}
          AND (p.puballtables OR EXISTS (
                SELECT 1 FROM pg_publication_rel r
                WHERE r.prpubid = p.oid AND r.prrelid = {{.TableLiteral}}::regclass))
    ) THEN
        ALTER PUBLICATION {{.Publication}} ADD TABLE {{.Table}};
    END IF;
END
$$;
