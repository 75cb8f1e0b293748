{{/*
pgoutbox.alertGroups renders the alert rules as a Prometheus rule file's
"groups" (the PrometheusRule's spec, and examples/prometheus-alerts.yaml).

Every pgoutbox series carries the "stream" label (the ServiceMonitor sets
it from the pod's pgoutbox.io/stream label), and the rules aggregate the
pair of a stream by it: the standby is never ready and never streams, and
both replicas poll the slot.
*/}}
{{- define "pgoutbox.alertGroups" -}}
{{- $p := .Values.prometheusRule -}}
{{- $sel := $p.selector | default (printf "job=%q,namespace=%q" (include "pgoutbox.fullname" .) .Release.Namespace) -}}
{{- $pods := list -}}
{{- range $s := .Values.streams -}}
{{- $pods = append $pods (include "pgoutbox.streamName" (dict "root" $ "stream" $s)) -}}
{{- end -}}
{{- $ksm := $p.kubeStateSelector | default (printf "namespace=%q,container=\"pgoutbox\",pod=~\"(%s)-[a-z0-9]+-[a-z0-9]+\"" .Release.Namespace (join "|" $pods)) -}}
{{- $m := printf "{%s}" $sel -}}
{{- $url := $p.runbookURL -}}
groups:
  - name: pgoutbox
    rules:
      # Neither replica answers /readyz with 200: nothing streams. A pod
      # that is down counts as not ready (up is 0, its pgoutbox_ready gone).
      - alert: PgoutboxNoReadyReplica
        expr: |-
          max by (namespace, stream) (pgoutbox_ready{{ $m }} or up{{ $m }} * 0) == 0
        for: {{ $p.notReadyFor }}
        labels:
          severity: critical
          {{- with $p.alertLabels }}
          {{- toYaml . | nindent 10 }}
          {{- end }}
        annotations:
          summary: {{ "pgoutbox stream {{ $labels.stream }} is not streaming" | quote }}
          description: {{ printf "No replica of {{ $labels.namespace }}/{{ $labels.stream }} has been ready (streaming and confirming) for %s; GET /readyz on its pods says why." $p.notReadyFor | quote }}
          runbook_url: {{ $url }}
      # The streaming replica is behind the server's WAL end.
      - alert: PgoutboxReplicationLagHigh
        expr: |-
          max by (namespace, stream) (pgoutbox_replication_lag_bytes{{ $m }} and pgoutbox_streaming{{ $m }} == 1) > {{ int64 $p.lagBytes }}
        for: {{ $p.lagFor }}
        labels:
          severity: warning
          {{- with $p.alertLabels }}
          {{- toYaml . | nindent 10 }}
          {{- end }}
        annotations:
          summary: {{ "pgoutbox stream {{ $labels.stream }} is {{ $value | humanize1024 }}B behind" | quote }}
          description: {{ printf "The slot of {{ $labels.namespace }}/{{ $labels.stream }} is confirmed {{ $value | humanize1024 }}B behind the server's WAL end, over the bound for %s." $p.lagFor | quote }}
          runbook_url: {{ $url }}
      # wal_status extended or unreserved: the slot holds more WAL than
      # max_wal_size, or past max_slot_wal_keep_size it may be removed.
      - alert: PgoutboxSlotWALNotReserved
        expr: |-
          max by (namespace, stream) ({{ printf "pgoutbox_slot_wal_status{%s,status=~\"extended|unreserved\"}" $sel }}) == 1
        for: {{ $p.walStatusFor }}
        labels:
          severity: warning
          {{- with $p.alertLabels }}
          {{- toYaml . | nindent 10 }}
          {{- end }}
        annotations:
          summary: {{ "The slot of pgoutbox stream {{ $labels.stream }} is not within its reserved WAL" | quote }}
          description: {{ "The replication slot of {{ $labels.namespace }}/{{ $labels.stream }} has wal_status extended or unreserved: it retains more WAL than max_wal_size, or so much that the server may remove WAL it still needs." | quote }}
          runbook_url: {{ $url }}
      # wal_status lost: the WAL the slot needed is gone, and so may events be.
      - alert: PgoutboxSlotLost
        expr: |-
          max by (namespace, stream) ({{ printf "pgoutbox_slot_wal_status{%s,status=\"lost\"}" $sel }}) == 1
        labels:
          severity: critical
          {{- with $p.alertLabels }}
          {{- toYaml . | nindent 10 }}
          {{- end }}
        annotations:
          summary: {{ "The slot of pgoutbox stream {{ $labels.stream }} is lost" | quote }}
          description: {{ "The replication slot of {{ $labels.namespace }}/{{ $labels.stream }} has wal_status lost: PostgreSQL removed WAL it had not confirmed, events may be missing, and pgoutbox refuses to start on it." | quote }}
          runbook_url: {{ $url }}
      # retained / (retained + safe_wal_size): the share of what
      # max_slot_wal_keep_size allows (no series without that limit).
      - alert: PgoutboxSlotRetainedWALNearLimit
        expr: |-
          max by (namespace, stream) (pgoutbox_slot_retained_wal_bytes{{ $m }} / (pgoutbox_slot_retained_wal_bytes{{ $m }} + pgoutbox_slot_safe_wal_size_bytes{{ $m }})) > {{ $p.retainedWALRatio }}
        for: {{ $p.retainedWALFor }}
        labels:
          severity: warning
          {{- with $p.alertLabels }}
          {{- toYaml . | nindent 10 }}
          {{- end }}
        annotations:
          summary: {{ "The slot of pgoutbox stream {{ $labels.stream }} is near max_slot_wal_keep_size" | quote }}
          description: {{ "The replication slot of {{ $labels.namespace }}/{{ $labels.stream }} retains {{ $value | humanizePercentage }} of the WAL max_slot_wal_keep_size allows it; at 100% it is lost." | quote }}
          runbook_url: {{ $url }}
      - alert: PgoutboxEventsDeadLettered
        expr: |-
          sum by (namespace, stream) ({{ include "pgoutbox.recentIncrease" (dict "metric" "pgoutbox_events_dead_lettered_total" "m" $m "window" $p.eventWindow) }}) > 0
        labels:
          severity: warning
          {{- with $p.alertLabels }}
          {{- toYaml . | nindent 10 }}
          {{- end }}
        annotations:
          summary: {{ "pgoutbox stream {{ $labels.stream }} dead-lettered events" | quote }}
          description: {{ printf "{{ $value | humanize }} events of {{ $labels.namespace }}/{{ $labels.stream }} went to the dead-letter topic instead of their own in the last %s." $p.eventWindow | quote }}
          runbook_url: {{ $url }}
      # Logical decoding messages that look like outbox events, whose
      # prefix is not messages.prefix and no other slot's state row
      # records: most likely a writer's prefix that is not the relay's,
      # its events skipped (the relay logs each prefix at Error).
      - alert: PgoutboxEventMessagesUnclaimed
        expr: |-
          sum by (namespace, stream) ({{ include "pgoutbox.recentIncrease" (dict "metric" "pgoutbox_skipped_messages_total" "m" (printf "{%s,reason=\"unclaimed_event\"}" $sel) "window" $p.eventWindow) }}) > 0
        labels:
          severity: warning
          {{- with $p.alertLabels }}
          {{- toYaml . | nindent 10 }}
          {{- end }}
        annotations:
          summary: {{ "pgoutbox stream {{ $labels.stream }} skipped messages that look like outbox events" | quote }}
          description: {{ printf "{{ $value | humanize }} logical decoding messages of {{ $labels.namespace }}/{{ $labels.stream }} looked like outbox events but had a prefix that is not messages.prefix and that no other relay records, in the last %s: if they are events, they were skipped. The pods' logs name the prefix." $p.eventWindow | quote }}
          runbook_url: {{ $url }}
      # The publication's catalog row was written (ALTER PUBLICATION ...
      # SET, OWNER TO, RENAME): if it stopped publishing inserts for a
      # while, the events committed then were never decoded, and nothing
      # else shows it (the relay logs it at Warn).
      - alert: PgoutboxPublicationAltered
        expr: |-
          sum by (namespace, stream) ({{ include "pgoutbox.recentIncrease" (dict "metric" "pgoutbox_publication_altered_total" "m" $m "window" $p.eventWindow) }}) > 0
        labels:
          severity: warning
          {{- with $p.alertLabels }}
          {{- toYaml . | nindent 10 }}
          {{- end }}
        annotations:
          summary: {{ "pgoutbox stream {{ $labels.stream }} found its publication altered" | quote }}
          description: {{ printf "The publication of {{ $labels.namespace }}/{{ $labels.stream }} was altered (ALTER PUBLICATION ... SET, OWNER TO, RENAME), found {{ $value | humanize }} times in the last %s: if it stopped publishing inserts for a while, the events committed then were never relayed. The pods' logs name the transactions." $p.eventWindow | quote }}
          runbook_url: {{ $url }}
      # A record Kafka refused after its retries (about 16 minutes by
      # default) or for good; each ends the session.
      - alert: PgoutboxProduceFailures
        expr: |-
          sum by (namespace, stream) ({{ include "pgoutbox.recentIncrease" (dict "metric" "pgoutbox_events_failed_total" "m" $m "window" $p.eventWindow) }}) > 0
        labels:
          severity: warning
          {{- with $p.alertLabels }}
          {{- toYaml . | nindent 10 }}
          {{- end }}
        annotations:
          summary: {{ "Kafka refused records of pgoutbox stream {{ $labels.stream }}" | quote }}
          description: {{ printf "{{ $value | humanize }} records of {{ $labels.namespace }}/{{ $labels.stream }} failed in Kafka in the last %s; each failure restarts the session from the slot." $p.eventWindow | quote }}
          runbook_url: {{ $url }}
      # Sessions that ended other than by a stop: the relay reconnects by
      # itself, so the pod does not restart.
      - alert: PgoutboxSessionsRestarting
        expr: |-
          sum by (namespace, stream) (increase({{ printf "pgoutbox_sessions_ended_total{%s,cause!=\"stopped\"}" $sel }}[{{ $p.restartWindow }}])) > {{ $p.sessionRestarts }}
        labels:
          severity: warning
          {{- with $p.alertLabels }}
          {{- toYaml . | nindent 10 }}
          {{- end }}
        annotations:
          summary: {{ "pgoutbox stream {{ $labels.stream }} keeps restarting its session" | quote }}
          description: {{ printf "{{ $value | humanize }} replication sessions of {{ $labels.namespace }}/{{ $labels.stream }} ended in failure in the last %s; the pods' logs name the cause (kafka, postgres, fatal)." $p.restartWindow | quote }}
          runbook_url: {{ $url }}
      # From kube-state-metrics: the container itself restarts.
      - alert: PgoutboxContainerRestarting
        expr: |-
          sum by (namespace, stream, pod) (label_replace(increase({{ printf "kube_pod_container_status_restarts_total{%s}" $ksm }}[{{ $p.restartWindow }}]), "stream", "$1", "pod", "(.+)-[a-z0-9]+-[a-z0-9]+")) > {{ $p.containerRestarts }}
        labels:
          severity: warning
          {{- with $p.alertLabels }}
          {{- toYaml . | nindent 10 }}
          {{- end }}
        annotations:
          summary: {{ "pgoutbox pod {{ $labels.pod }} is restarting in a loop" | quote }}
          description: {{ printf "The pgoutbox container of {{ $labels.namespace }}/{{ $labels.pod }} restarted {{ $value | humanize }} times in the last %s; its previous log (kubectl logs --previous) ends with the reason." $p.restartWindow | quote }}
          runbook_url: {{ $url }}
      # The slot alerts above see nothing while the slot cannot be read.
      - alert: PgoutboxSlotPollFailing
        expr: |-
          sum by (namespace, stream) (increase(pgoutbox_slot_poll_errors_total{{ $m }}[{{ $p.restartWindow }}])) > {{ $p.slotPollErrors }}
        labels:
          severity: warning
          {{- with $p.alertLabels }}
          {{- toYaml . | nindent 10 }}
          {{- end }}
        annotations:
          summary: {{ "pgoutbox stream {{ $labels.stream }} cannot read its slot's WAL usage" | quote }}
          description: {{ printf "Reads of pg_replication_slots by {{ $labels.namespace }}/{{ $labels.stream }} failed {{ $value | humanize }} times in the last %s: the slot alerts are blind meanwhile." $p.restartWindow | quote }}
          runbook_url: {{ $url }}
      # The poll source (relay.source: poll): the oldest unpublished row of
      # its table is old. Rows wait for a relay that does not claim, or one
      # row fails and holds its key's later rows back. Series exist only
      # with the poll source.
      - alert: PgoutboxOutboxBacklogOld
        expr: |-
          max by (namespace, stream) (pgoutbox_outbox_oldest_unpublished_age_seconds{{ $m }}) > {{ $p.backlogAgeSeconds }}
        for: {{ $p.backlogFor }}
        labels:
          severity: warning
          {{- with $p.alertLabels }}
          {{- toYaml . | nindent 10 }}
          {{- end }}
        annotations:
          summary: {{ "The outbox of pgoutbox stream {{ $labels.stream }} has rows waiting {{ $value | humanizeDuration }}" | quote }}
          description: {{ printf "The oldest unpublished row of the outbox table of {{ $labels.namespace }}/{{ $labels.stream }} was written {{ $value | humanizeDuration }} ago, over %v s for %s; pgoutbox_outbox_unpublished_rows and pgoutbox_outbox_failed_rows say how many wait and how many failed." $p.backlogAgeSeconds $p.backlogFor | quote }}
          runbook_url: {{ $url }}
      # PgoutboxOutboxBacklogOld sees nothing while the backlog cannot be
      # read (its count is slowest when the backlog is largest).
      - alert: PgoutboxOutboxBacklogUnreadable
        expr: |-
          sum by (namespace, stream) (increase(pgoutbox_outbox_backlog_read_errors_total{{ $m }}[{{ $p.restartWindow }}])) > {{ $p.slotPollErrors }}
        labels:
          severity: warning
          {{- with $p.alertLabels }}
          {{- toYaml . | nindent 10 }}
          {{- end }}
        annotations:
          summary: {{ "pgoutbox stream {{ $labels.stream }} cannot read its outbox table's backlog" | quote }}
          description: {{ printf "Reads of the outbox table's backlog by {{ $labels.namespace }}/{{ $labels.stream }} failed {{ $value | humanize }} times in the last %s: pgoutbox_outbox_oldest_unpublished_age_seconds is stale and PgoutboxOutboxBacklogOld blind meanwhile." $p.restartWindow | quote }}
          runbook_url: {{ $url }}
{{- end -}}

{{/*
pgoutbox.recentIncrease is how much a counter grew over a window, given
(dict "metric" name "m" "{matchers}" "window" duration), including a
series that appeared within the window: a counter whose labelled child is
created by its first event starts at 1, and increase() alone never sees
that first one.
*/}}
{{- define "pgoutbox.recentIncrease" -}}
({{ .metric }}{{ .m }} unless {{ .metric }}{{ .m }} offset {{ .window }}) or increase({{ .metric }}{{ .m }}[{{ .window }}])
{{- end -}}
