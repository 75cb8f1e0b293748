-- The poll source's record of the table it last checked under each name
-- (one row per poll table, in the poll table's schema). The relay reads
-- its table by name: a table renamed away or moved to another schema with
-- rows not published, another made under its name, is found by comparing
-- the table the name names with the one checked before, and this record
-- keeps that one across restarts, so that the rows are not left behind
-- without a word after a restart, or after a rename while the relay was
-- stopped. A table is known by its OID and its row type's OID (both given
-- when it is made, both kept through renames and moves), in the catalog of
-- the cluster and database that gave them (a restored copy has other
-- OIDs). The relay's role needs SELECT, INSERT and UPDATE on it; it makes
-- the table at its first start if it may.
CREATE TABLE IF NOT EXISTS {{.StateTable}} (
    table_name        text        PRIMARY KEY,
    table_oid         oid         NOT NULL,
    row_type_oid      oid         NOT NULL,
    system_identifier text        NOT NULL,
    database_oid      oid         NOT NULL,
    checked_at        timestamptz NOT NULL
);
