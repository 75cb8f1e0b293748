{{/*
pgoutbox.fullname is the prefix of every object's name: fullnameOverride,
else the release name, with the chart's name added unless the release name
contains it.
*/}}
{{- define "pgoutbox.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride -}}
{{- else if contains .Chart.Name .Release.Name -}}
{{- .Release.Name -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name -}}
{{- end -}}
{{- end -}}

{{/*
pgoutbox.streamName is a stream's object name, <fullname>-<stream name>,
given (dict "root" $ "stream" $stream). It is also the value of the
pgoutbox.io/stream label and so of the "stream" label of the metrics.
*/}}
{{- define "pgoutbox.streamName" -}}
{{- printf "%s-%s" (include "pgoutbox.fullname" .root) .stream.name -}}
{{- end -}}

{{- define "pgoutbox.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* pgoutbox.selectorLabels select the pods of one stream. */}}
{{- define "pgoutbox.selectorLabels" -}}
app.kubernetes.io/name: {{ .root.Chart.Name }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
pgoutbox.io/stream: {{ include "pgoutbox.streamName" . }}
{{- end -}}

{{- define "pgoutbox.streamLabels" -}}
{{ include "pgoutbox.labels" .root }}
app.kubernetes.io/component: relay
pgoutbox.io/stream: {{ include "pgoutbox.streamName" . }}
{{- end -}}

{{- define "pgoutbox.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}
{{- end -}}

{{/* Where the pods find their files. */}}
{{- define "pgoutbox.configDir" -}}/etc/pgoutbox{{- end -}}
{{- define "pgoutbox.secretsDir" -}}/var/run/secrets/pgoutbox{{- end -}}

{{/*
pgoutbox.validate fails the rendering for values the chart cannot turn
into working pods. It prints nothing.
*/}}
{{- define "pgoutbox.validate" -}}
{{- $seen := dict -}}
{{- range $i, $s := .Values.streams -}}
{{- if not $s.name -}}
{{- fail (printf "streams[%d]: name is required" $i) -}}
{{- end -}}
{{- if not (regexMatch "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$" $s.name) -}}
{{- fail (printf "streams[%d]: name %q: use lower-case letters, digits and \"-\"" $i $s.name) -}}
{{- end -}}
{{- if hasKey $seen $s.name -}}
{{- fail (printf "streams: the name %q is given twice" $s.name) -}}
{{- end -}}
{{- $_ := set $seen $s.name true -}}
{{- $name := include "pgoutbox.streamName" (dict "root" $ "stream" $s) -}}
{{- if gt (len $name) 63 -}}
{{- fail (printf "stream %s: %q is longer than 63 characters (a label value): shorten the stream's name or fullnameOverride" $s.name $name) -}}
{{- end -}}
{{- end -}}
{{- /*
A slot has one consumer: two streams on one slot would be pods of two
Deployments taking it from each other, each relaying under its own
settings. A slot belongs to one database, but its name is unique on its
server across all databases (PostgreSQL's "Logical Decoding Concepts"),
so two streams are compared when the chart sees the server of both
(pgoutbox.database): the same name on two servers is two slots. A stream
whose slot or server the chart cannot see (a connector or DSN in a
Secret, say) is not compared.
*/ -}}
{{- $slots := dict -}}
{{- range $s := .Values.streams -}}
{{- $slot := include "pgoutbox.slotName" (dict "root" $ "stream" $s) -}}
{{- $database := include "pgoutbox.database" (dict "root" $ "stream" $s) -}}
{{- if and $slot $database -}}
{{- $server := regexReplaceAll "/.*$" $database "" -}}
{{- $key := printf "%s %s" $server $slot -}}
{{- $dbname := regexReplaceAll "^[^/]*/" $database "" -}}
{{- if hasKey $slots $key -}}
{{- $other := get $slots $key -}}
{{- $databases := printf "database %s" $dbname -}}
{{- if ne $other.dbname $dbname -}}
{{- $databases = printf "databases %s and %s" $other.dbname $dbname -}}
{{- end -}}
{{- fail (printf "streams %s and %s both use the replication slot %q on the database server %s (%s): a slot has one consumer, and its name is unique on its server across all its databases, so their pods would take it from each other, each relaying under its own settings (or, in two databases, one would find it made in the other's); give each stream a slot of its own (postgres.slot, or slot.name in the connector JSON, whose default is Debezium's, debezium)" $other.name $s.name $slot $server $databases) -}}
{{- end -}}
{{- $_ := set $slots $key (dict "name" $s.name "dbname" $dbname) -}}
{{- end -}}
{{- end -}}
{{- /*
A transactional id is one producer: each exactly-once start fences every
earlier producer of its id, so two streams with one id fence each other at
every start, and each fenced pod exits 1, a crash loop that passes back and
forth (README.md, kafka.transactional.id). An id in the release's config
is merged into every stream. Compared: the id each stream's config file
ends with (what pgoutbox reads), for the streams whose exactly-once mode
is on (kafka.exactly.once, or exactly.once.support=required in an inline
connector) or cannot be seen (a connector in a Secret, which may set
exactly.once.support). A connector JSON has no key for the id. Without an
id of its own a stream's is derived from its slot, which the check above
keeps apart.
*/ -}}
{{- $ids := dict -}}
{{- range $s := .Values.streams -}}
{{- $ctx := dict "root" $ "stream" $s -}}
{{- $kafka := (include "pgoutbox.config" $ctx | fromYaml).kafka | default dict -}}
{{- $id := get $kafka "transactional.id" | default "" | toString -}}
{{- $conn := $s.connector | default dict -}}
{{- $eos := has (get $kafka "exactly.once" | toString | lower) (list "true" "yes" "on") -}}
{{- if $conn.json -}}
{{- $inner := $conn.json.config | default $conn.json -}}
{{- $eos = or $eos (eq (get $inner "exactly.once.support" | default "" | toString | trim | lower) "required") -}}
{{- else if $conn.secret -}}
{{- $eos = true -}}
{{- end -}}
{{- if and $id $eos -}}
{{- $_ := set $ids $id (append (get $ids $id | default list) $s.name) -}}
{{- end -}}
{{- end -}}
{{- range $id := keys $ids | sortAlpha -}}
{{- $names := get $ids $id -}}
{{- if gt (len $names) 1 -}}
{{- $where := "each stream's config sets it" -}}
{{- if eq (get (($.Values.config | default dict).kafka | default dict) "transactional.id" | default "" | toString) $id -}}
{{- $where = "config.kafka.transactional.id, which is merged into every stream, sets it" -}}
{{- end -}}
{{- fail (printf "streams %s use the one kafka.transactional.id %q with exactly-once on (or, for a connector in a Secret, possibly on; %s): each stream's start fences the others' producer, and the fenced pod exits 1, a crash loop passing from stream to stream; remove kafka.transactional.id (pgoutbox derives one from each stream's slot), or give each stream its own in streams[].config" (join ", " $names) $id $where) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
pgoutbox.database is the database a stream relays from, as
<server>/<dbname> with <server> host:port, given (dict "root" $ "stream"
$stream), where the chart can see it: in the stream's postgres.dsn (else
the config's postgres.dsn), a URL (host and port also read from its
query's host= and port=) or key=value, or in an inline connector JSON's
database.hostname, database.port and database.dbname. A port not given
is 5432, libpq's and Debezium's default. A host is written lower-case,
without a final dot, a name of the release's namespace (orders-db) as
orders-db.<namespace>.svc and .svc.cluster.local as .svc, so that one
server written two common ways is one. Nothing where the chart cannot see
the server: a DSN or connector in a Secret, a value from a connector's
config provider (${env:...}, ${file:...}), no host (libpq then reads
PGHOST, or takes a local socket), a socket directory, or a loopback
address (a server in or beside each pod, which may be another for each
stream).
*/}}
{{- define "pgoutbox.database" -}}
{{- $s := .stream -}}
{{- $conn := $s.connector | default dict -}}
{{- $sp := $s.postgres | default dict -}}
{{- $host := "" -}}
{{- $port := "" -}}
{{- $db := "" -}}
{{- if $conn.json -}}
{{- $inner := $conn.json.config | default $conn.json -}}
{{- $host = get $inner "database.hostname" | default "" | toString -}}
{{- $port = get $inner "database.port" | default "" | toString -}}
{{- $db = get $inner "database.dbname" | default "" | toString -}}
{{- else if not (or $conn.secret $sp.dsnSecret) -}}
{{- $cfg := mustMergeOverwrite (deepCopy (.root.Values.config | default dict)) (deepCopy ($s.config | default dict)) -}}
{{- $pg := $cfg.postgres | default dict -}}
{{- $dsn := $sp.dsn | default $pg.dsn | default "" | toString | trim -}}
{{- if regexMatch "^[a-zA-Z][a-zA-Z0-9+.-]*://" $dsn -}}
{{- $authority := regexReplaceAll "^.*@" (regexReplaceAll "^[a-zA-Z][a-zA-Z0-9+.-]*://([^/?#]*).*$" $dsn "${1}") "" -}}
{{- if regexMatch "^\\[[^\\]]*\\](:[0-9]*)?$" $authority -}}
{{- $host = regexReplaceAll "^\\[([^\\]]*)\\].*$" $authority "${1}" -}}
{{- $port = regexReplaceAll "^\\[[^\\]]*\\]:?" $authority "" -}}
{{- else if contains "," $authority -}}
{{- /* Several hosts: the list as written is the server. */ -}}
{{- $host = $authority -}}
{{- $port = "-" -}}
{{- else -}}
{{- $host = regexReplaceAll ":[^:]*$" $authority "" -}}
{{- $port = regexReplaceAll "^[^:]*:?" $authority "" -}}
{{- end -}}
{{- if regexMatch "^[^?#]*://[^/?#]*/[^?#]" $dsn -}}
{{- $db = regexReplaceAll "^[^?#]*://[^/?#]*/([^?#]*).*$" $dsn "${1}" -}}
{{- end -}}
{{- range $key := list "host" "port" "dbname" -}}
{{- if regexMatch (printf "\\?(.*&)?%s=[^&#]" $key) $dsn -}}
{{- $v := regexReplaceAll (printf "^.*[?&]%s=([^&#]*).*$" $key) $dsn "${1}" -}}
{{- if eq $key "host" -}}{{- $host = $v -}}{{- else if eq $key "port" -}}{{- $port = $v -}}{{- else -}}{{- $db = $v -}}{{- end -}}
{{- end -}}
{{- end -}}
{{- else if $dsn -}}
{{- range $key := list "host" "port" "dbname" -}}
{{- if regexMatch (printf "(^|\\s)%s\\s*=\\s*'?[^'\\s]" $key) $dsn -}}
{{- $v := regexReplaceAll (printf "(?s)^(.*\\s)?%s\\s*=\\s*'?([^'\\s]*).*$" $key) $dsn "${2}" -}}
{{- if eq $key "host" -}}{{- $host = $v -}}{{- else if eq $key "port" -}}{{- $port = $v -}}{{- else -}}{{- $db = $v -}}{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- $host = $host | trim | lower | trimSuffix "." -}}
{{- $port = $port | trim -}}
{{- if hasSuffix ".svc.cluster.local" $host -}}
{{- $host = trimSuffix ".cluster.local" $host -}}
{{- end -}}
{{- $local := or (not $host) (hasPrefix "/" $host) (hasPrefix "%2f" $host) (eq $host "localhost") (hasPrefix "127." $host) (eq $host "::1") -}}
{{- if not (or $local (contains "${" (printf "%s %s %s" $host $port $db))) -}}
{{- if not (or (contains "." $host) (contains ":" $host) (contains "," $host)) -}}
{{- $host = printf "%s.%s.svc" $host .root.Release.Namespace -}}
{{- end -}}
{{- if contains ":" $host -}}
{{- $host = printf "[%s]" $host -}}
{{- end -}}
{{- if eq $port "-" -}}
{{- $host -}}
{{- else -}}
{{- printf "%s:%s" $host ($port | default "5432") -}}
{{- end -}}
/{{- $db | default "(not given)" -}}
{{- end -}}
{{- end -}}

{{/*
pgoutbox.slotName is the replication slot a stream uses, given (dict
"root" $ "stream" $stream): for a connector given inline its slot.name,
or Debezium's default, debezium, as pgoutbox reads it; for a connector in
a Secret nothing (the chart cannot see it); otherwise postgres.slot, else
the config's postgres.slot.name, else the stream's name with "_" for "-".
*/}}
{{- define "pgoutbox.slotName" -}}
{{- $s := .stream -}}
{{- $conn := $s.connector | default dict -}}
{{- if $conn.json -}}
{{- $inner := $conn.json.config | default $conn.json -}}
{{- get $inner "slot.name" | default "debezium" -}}
{{- else if not $conn.secret -}}
{{- $cfg := mustMergeOverwrite (deepCopy (.root.Values.config | default dict)) (deepCopy ($s.config | default dict)) -}}
{{- $pg := $cfg.postgres | default dict -}}
{{- $sp := $s.postgres | default dict -}}
{{- $sp.slot | default (get $pg "slot.name") | default ($s.name | replace "-" "_") -}}
{{- end -}}
{{- end -}}

{{/*
pgoutbox.refuseDSNPassword fails if a connection string carries a password:
user:password@ in a URL, a password parameter in a URL's query, or
password= in the key=value form.
*/}}
{{- define "pgoutbox.refuseDSNPassword" -}}
{{- if or (regexMatch "^[a-zA-Z][a-zA-Z0-9+.-]*://[^/@?]*:[^/@?]*@" .dsn) (regexMatch "[?&]password=" .dsn) (regexMatch "(^|\\s)password\\s*=" .dsn) -}}
{{- fail (printf "stream %s: %s carries a password; remove it and give postgres.passwordSecret (a Secret mounted as a file)" .stream .where) -}}
{{- end -}}
{{- end -}}

{{/*
pgoutbox.config renders the YAML configuration of one stream, given (dict
"root" $ "stream" $stream): the release's config, the stream's config over
it, then the stream's own keys, then the keys the chart owns.
*/}}
{{- define "pgoutbox.config" -}}
{{- $root := .root -}}
{{- $s := .stream -}}
{{- $cfg := mustMergeOverwrite (deepCopy ($root.Values.config | default dict)) (deepCopy ($s.config | default dict)) -}}
{{- $pg := $cfg.postgres | default dict -}}
{{- $kafka := $cfg.kafka | default dict -}}
{{- $metrics := $cfg.metrics | default dict -}}
{{- $relay := $cfg.relay | default dict -}}
{{- range $key := list "password" "password.file" -}}
{{- if hasKey $pg $key -}}
{{- fail (printf "stream %s: postgres.%s is not accepted in config: give postgres.passwordSecret, which the chart mounts as a file" $s.name $key) -}}
{{- end -}}
{{- if hasKey $kafka (printf "sasl.%s" $key) -}}
{{- fail (printf "stream %s: kafka.sasl.%s is not accepted in config: give kafka.saslPasswordSecret, which the chart mounts as a file" $s.name $key) -}}
{{- end -}}
{{- end -}}
{{- if hasKey $metrics "listen" -}}
{{- fail (printf "stream %s: metrics.listen is set by the chart: set metrics.port instead" $s.name) -}}
{{- end -}}
{{- if hasKey $relay "shutdown.timeout" -}}
{{- fail (printf "stream %s: relay.shutdown.timeout is set by the chart: set shutdownTimeoutSeconds instead (it sizes the pods' grace period too)" $s.name) -}}
{{- end -}}

{{- $sp := $s.postgres | default dict -}}
{{- $conn := $s.connector | default dict -}}
{{- if and $sp.dsn $sp.dsnSecret -}}
{{- fail (printf "stream %s: give postgres.dsn or postgres.dsnSecret, not both" $s.name) -}}
{{- end -}}
{{- if $sp.dsn -}}
{{- $_ := set $pg "dsn" $sp.dsn -}}
{{- end -}}
{{- if $pg.dsn -}}
{{- include "pgoutbox.refuseDSNPassword" (dict "dsn" $pg.dsn "stream" $s.name "where" "postgres.dsn") -}}
{{- end -}}
{{- if $conn -}}
{{- if and $conn.json $conn.secret -}}
{{- fail (printf "stream %s: give connector.json or connector.secret, not both" $s.name) -}}
{{- end -}}
{{- if not (or $conn.json $conn.secret) -}}
{{- fail (printf "stream %s: connector needs json (inline) or secret (a Secret holding the JSON)" $s.name) -}}
{{- end -}}
{{- range $key := list "dsn" "dsnSecret" "slot" "publication" "tables" -}}
{{- if hasKey $sp $key -}}
{{- fail (printf "stream %s: the connector sets the database, slot, publication and tables: remove postgres.%s" $s.name $key) -}}
{{- end -}}
{{- end -}}
{{- if $s.router -}}
{{- fail (printf "stream %s: the connector's EventRouter options are the router options: remove router" $s.name) -}}
{{- end -}}
{{- if $conn.json -}}
{{- $inner := $conn.json.config | default $conn.json -}}
{{- if or (hasKey $conn.json "database.password") (hasKey $inner "database.password") -}}
{{- fail (printf "stream %s: connector.json holds database.password, which would land in a ConfigMap: remove it and give postgres.passwordSecret, or keep the whole JSON in a Secret (connector.secret)" $s.name) -}}
{{- end -}}
{{- end -}}
{{- else -}}
{{- if not (or $pg.dsn $sp.dsnSecret) -}}
{{- fail (printf "stream %s: no database: give postgres.dsn, postgres.dsnSecret or connector" $s.name) -}}
{{- end -}}
{{- $slot := include "pgoutbox.slotName" . -}}
{{- $_ := set $pg "slot.name" $slot -}}
{{- $_ := set $pg "publication.name" ($sp.publication | default (get $pg "publication.name") | default $slot) -}}
{{- if $sp.tables -}}
{{- $_ := set $pg "table.include.list" $sp.tables -}}
{{- end -}}
{{- end -}}
{{- if $sp.passwordSecret -}}
{{- $_ := set $pg "password.file" (printf "%s/postgres/password" (include "pgoutbox.secretsDir" $root)) -}}
{{- end -}}
{{- if $pg -}}
{{- $_ := set $cfg "postgres" $pg -}}
{{- end -}}

{{- if not $kafka.brokers -}}
{{- fail (printf "stream %s: kafka.brokers is empty: set config.kafka.brokers" $s.name) -}}
{{- end -}}
{{- if (include "pgoutbox.kafkaSecret" .) -}}
{{- $_ := set $kafka "sasl.password.file" (printf "%s/kafka/password" (include "pgoutbox.secretsDir" $root)) -}}
{{- end -}}
{{- $_ := set $cfg "kafka" $kafka -}}
{{- if $s.router -}}
{{- $_ := set $cfg "router" (mustMergeOverwrite ($cfg.router | default dict) (deepCopy $s.router)) -}}
{{- end -}}
{{- if $s.routes -}}
{{- $_ := set $cfg "routes" (deepCopy $s.routes) -}}
{{- end -}}
{{- $_ := set $metrics "listen" (printf ":%d" (int $root.Values.metrics.port)) -}}
{{- $_ := set $cfg "metrics" $metrics -}}
{{- $_ := set $relay "shutdown.timeout" (printf "%ds" (int (include "pgoutbox.shutdownTimeout" .))) -}}
{{- $_ := set $cfg "relay" $relay -}}
{{- toYaml $cfg -}}
{{- end -}}

{{/* pgoutbox.kafkaSecret is the stream's Kafka SASL password Secret as JSON, or nothing. */}}
{{- define "pgoutbox.kafkaSecret" -}}
{{- $k := .stream.kafka | default dict -}}
{{- $secret := $k.saslPasswordSecret | default .root.Values.kafka.saslPasswordSecret -}}
{{- if $secret -}}
{{- toJson $secret -}}
{{- end -}}
{{- end -}}

{{- define "pgoutbox.shutdownTimeout" -}}
{{- $t := .stream.shutdownTimeoutSeconds | default .root.Values.shutdownTimeoutSeconds -}}
{{- if lt (int $t) 1 -}}
{{- fail (printf "stream %s: shutdownTimeoutSeconds must be at least 1" .stream.name) -}}
{{- end -}}
{{- int $t -}}
{{- end -}}

{{/*
pgoutbox.goMemLimit is GOMEMLIMIT for a memory limit (a Kubernetes
quantity: a whole number of bytes with an optional suffix, k, M, G, T or
Ki, Mi, Gi, Ti): goMemLimitPercent of it, rounded down to whole MiB, given
(dict "limit" q "percent" p).
*/}}
{{- define "pgoutbox.goMemLimit" -}}
{{- $q := .limit -}}
{{- if kindIs "float64" $q -}}
{{- $q = int64 $q | toString -}}
{{- end -}}
{{- $q = toString $q -}}
{{- $units := dict "" 1 "k" 1000 "M" 1000000 "G" 1000000000 "T" 1000000000000 "Ki" 1024 "Mi" 1048576 "Gi" 1073741824 "Ti" 1099511627776 -}}
{{- if not (regexMatch "^[0-9]+(k|M|G|T|Ki|Mi|Gi|Ti)?$" $q) -}}
{{- fail (printf "resources.limits.memory %q: use a whole number with an optional suffix (Mi, Gi, M, G, ...)" $q) -}}
{{- end -}}
{{- $unit := regexReplaceAll "^[0-9]+" $q "" -}}
{{- $n := regexReplaceAll "[^0-9]+$" $q "" | int64 -}}
{{- $bytes := mul $n (get $units $unit) -}}
{{- printf "%dMiB" (div (div (mul $bytes (int .percent)) 100) 1048576) -}}
{{- end -}}
