-- Wake-ups for the poll source: one notification per inserting statement,
-- delivered when its transaction commits (PostgreSQL folds the equal
-- notifications of one transaction into one).
CREATE OR REPLACE FUNCTION {{.Function}}() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify(TG_ARGV[0], '');
    RETURN NULL;
END
$$;
{{if .Plan.NotifyTrigger}}CREATE OR REPLACE TRIGGER {{.Trigger}} AFTER INSERT ON {{.Table}}
    FOR EACH STATEMENT EXECUTE FUNCTION {{.Function}}({{.Channel}});
{{end}}