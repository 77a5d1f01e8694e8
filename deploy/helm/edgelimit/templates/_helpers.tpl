{{/* Names and labels. */}}
{{- define "edgelimit.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "edgelimit.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* selector COMPONENT: the labels a component's pods are selected by. */}}
{{- define "edgelimit.selector" -}}
app.kubernetes.io/name: {{ .root.Chart.Name }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "edgelimit.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{/* tlsSection PREFIX TLS: a boot.TLS section; a CA from a Secret is
mounted at /etc/edgelimit/tls/PREFIX/ca.crt. */}}
{{- define "edgelimit.tls" -}}
{{- $t := dict "enabled" .tls.enabled -}}
{{- if and .tls.enabled .tls.caSecret -}}
{{- $_ := set $t "ca_file" (printf "/etc/edgelimit/tls/%s/ca.crt" .name) -}}
{{- end -}}
{{- if .tls.serverName -}}
{{- $_ := set $t "server_name" .tls.serverName -}}
{{- end -}}
{{- toYaml $t -}}
{{- end -}}

{{/* redis: the redis section every binary that talks to Redis reads. */}}
{{- define "edgelimit.redis" -}}
{{- $r := .Values.redis -}}
{{- $out := dict "prefix" $r.prefix -}}
{{- if eq $r.mode "standalone" -}}
{{- $_ := set $out "addr" (required "redis.addr is required with redis.mode standalone" $r.addr) -}}
{{- else if eq $r.mode "sentinel" -}}
{{- if not $r.sentinelAddrs -}}{{- fail "redis.sentinelAddrs is required with redis.mode sentinel" -}}{{- end -}}
{{- $_ := set $out "sentinel_addrs" $r.sentinelAddrs -}}
{{- $_ := set $out "sentinel_master" (required "redis.sentinelMaster is required with redis.mode sentinel" $r.sentinelMaster) -}}
{{- if $r.sentinelUsername -}}{{- $_ := set $out "sentinel_username" $r.sentinelUsername -}}{{- end -}}
{{- else if eq $r.mode "cluster" -}}
{{- if not $r.clusterAddrs -}}{{- fail "redis.clusterAddrs is required with redis.mode cluster" -}}{{- end -}}
{{- $_ := set $out "cluster_addrs" $r.clusterAddrs -}}
{{- else -}}
{{- fail (printf "redis.mode %q: want standalone, sentinel or cluster" $r.mode) -}}
{{- end -}}
{{- if $r.username -}}{{- $_ := set $out "username" $r.username -}}{{- end -}}
{{- if $r.tls.enabled -}}{{- $_ := set $out "tls" (include "edgelimit.tls" (dict "name" "redis" "tls" $r.tls) | fromYaml) -}}{{- end -}}
{{- toYaml $out -}}
{{- end -}}

{{- define "edgelimit.kafka" -}}
{{- $k := .Values.kafka -}}
{{- if not $k.brokers -}}{{- fail "kafka.brokers is required while kafka.enabled (the decision stream); set kafka.enabled=false for none" -}}{{- end -}}
{{- $out := dict "brokers" $k.brokers "topic" $k.topic -}}
{{- if $k.tls.enabled -}}{{- $_ := set $out "tls" (include "edgelimit.tls" (dict "name" "kafka" "tls" $k.tls) | fromYaml) -}}{{- end -}}
{{- if $k.sasl.mechanism -}}{{- $_ := set $out "sasl" (dict "mechanism" $k.sasl.mechanism "username" $k.sasl.username) -}}{{- end -}}
{{- toYaml $out -}}
{{- end -}}

{{- define "edgelimit.clickhouse" -}}
{{- $c := .Values.clickhouse -}}
{{- $out := dict "addr" (required "clickhouse.addr is required (the consumer and analytics read and write it)" $c.addr) "database" $c.database "username" $c.username -}}
{{- if $c.tls.enabled -}}{{- $_ := set $out "tls" (include "edgelimit.tls" (dict "name" "clickhouse" "tls" $c.tls) | fromYaml) -}}{{- end -}}
{{- toYaml $out -}}
{{- end -}}

{{/* secretEnv NAME REF: an env var from a Secret's key, when REF names one. */}}
{{- define "edgelimit.secretEnv" -}}
{{- if .ref.secret }}
- name: {{ .name }}
  valueFrom:
    secretKeyRef:
      name: {{ .ref.secret }}
      key: {{ .ref.key }}
{{- end }}
{{- end -}}

{{- define "edgelimit.redisEnv" -}}
{{- include "edgelimit.secretEnv" (dict "name" "EDGELIMIT_REDIS_PASSWORD" "ref" .Values.redis.password) }}
{{- include "edgelimit.secretEnv" (dict "name" "EDGELIMIT_REDIS_SENTINEL_PASSWORD" "ref" .Values.redis.sentinelPassword) }}
{{- end -}}

{{- define "edgelimit.kafkaEnv" -}}
{{- include "edgelimit.secretEnv" (dict "name" "EDGELIMIT_KAFKA_SASL_PASSWORD" "ref" .Values.kafka.sasl.password) }}
{{- end -}}

{{- define "edgelimit.clickhouseEnv" -}}
{{- include "edgelimit.secretEnv" (dict "name" "EDGELIMIT_CLICKHOUSE_PASSWORD" "ref" .Values.clickhouse.password) }}
{{- end -}}

{{/* tlsVolumes NAMES: a volume per TLS CA Secret the component uses. */}}
{{- define "edgelimit.tlsVolumes" -}}
{{- range $name, $tls := .tls }}
{{- if and $tls.enabled $tls.caSecret }}
- name: tls-{{ $name }}
  secret:
    secretName: {{ $tls.caSecret }}
{{- end }}
{{- end }}
{{- end -}}

{{- define "edgelimit.tlsMounts" -}}
{{- range $name, $tls := .tls }}
{{- if and $tls.enabled $tls.caSecret }}
- name: tls-{{ $name }}
  mountPath: /etc/edgelimit/tls/{{ $name }}
  readOnly: true
{{- end }}
{{- end }}
{{- end -}}

{{/* The gateways a local failure policy shares a limit among: the most
that can run (the autoscaler's maximum), so that during a store outage the
fleet never admits more than the rule. */}}
{{- define "edgelimit.expectedGateways" -}}
{{- if .Values.gateway.hpa.enabled -}}{{ .Values.gateway.hpa.maxReplicas }}{{- else -}}{{ .Values.gateway.replicas }}{{- end -}}
{{- end -}}

{{/* block TEXT N: TEXT's lines, each on a new line indented N, or nothing. */}}
{{- define "edgelimit.block" -}}
{{- with trim .text }}{{ nindent (int $.n) . }}{{ end -}}
{{- end -}}
