package outbox

import _ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx"

const sqlDriverName = "pgx"
