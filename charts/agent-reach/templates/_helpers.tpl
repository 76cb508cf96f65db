{{- define "agent-reach.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "agent-reach.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "agent-reach.selector" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "agent-reach.image" -}}
{{- $image := mergeOverwrite (deepCopy .root.Values.image) (.override | default dict) -}}
{{- printf "%s:%s" $image.repository (toString ($image.tag | default .root.Chart.AppVersion)) -}}
{{- end -}}

{{- define "agent-reach.databaseSecret" -}}
{{- .Values.database.existingSecret | default (printf "%s-database" (include "agent-reach.fullname" .)) -}}
{{- end -}}

{{- define "agent-reach.redisSecret" -}}
{{- .Values.redis.existingSecret | default (printf "%s-redis" (include "agent-reach.fullname" .)) -}}
{{- end -}}

{{- define "agent-reach.tlsSecret" -}}
{{- .Values.tls.existingSecret | default (printf "%s-tls" (include "agent-reach.fullname" .)) -}}
{{- end -}}

{{- define "agent-reach.toolsConfigMap" -}}
{{- .Values.tools.existingConfigMap | default (printf "%s-tools" (include "agent-reach.fullname" .)) -}}
{{- end -}}

{{- define "agent-reach.policyConfigMap" -}}
{{- .Values.policy.existingConfigMap | default (printf "%s-policy" (include "agent-reach.fullname" .)) -}}
{{- end -}}

{{- define "agent-reach.hasPolicy" -}}
{{- if or .Values.policy.existingConfigMap .Values.policy.matrix }}true{{ end -}}
{{- end -}}

{{- define "agent-reach.hasTokens" -}}
{{- if or .Values.executorTokens.existingSecret .Values.executorTokens.entries }}true{{ end -}}
{{- end -}}

{{- define "agent-reach.tokensSecret" -}}
{{- .Values.executorTokens.existingSecret | default (printf "%s-executor-tokens" (include "agent-reach.fullname" .)) -}}
{{- end -}}

{{/* The database's address, for controllers and the migration Job (nothing else gets it). */}}
{{- define "agent-reach.databaseEnv" -}}
- name: AGENT_REACH_CONTROLLER_DATABASE_URL
  valueFrom:
    secretKeyRef:
      name: {{ include "agent-reach.databaseSecret" . }}
      key: {{ .Values.database.existingSecretKey }}
{{- end -}}

{{- define "agent-reach.redisEnv" -}}
{{- if or .Values.redis.url .Values.redis.existingSecret }}
- name: AGENT_REACH_CONTROLLER_REDIS_URL
  valueFrom:
    secretKeyRef:
      name: {{ include "agent-reach.redisSecret" . }}
      key: {{ .Values.redis.existingSecretKey }}
{{- end }}
{{- end -}}

{{- define "agent-reach.tracingEnv" -}}
{{- if .root.Values.tracing.endpoint }}
- name: OTEL_EXPORTER_OTLP_ENDPOINT
  value: {{ .root.Values.tracing.endpoint | quote }}
- name: OTEL_SERVICE_NAME
  value: {{ .service | quote }}
- name: OTEL_TRACES_SAMPLER
  value: {{ .root.Values.tracing.sampler | quote }}
- name: OTEL_TRACES_SAMPLER_ARG
  value: {{ .root.Values.tracing.samplerArg | quote }}
{{- end }}
{{- end -}}

{{- define "agent-reach.httpScheme" -}}
{{- if .Values.tls.enabled }}HTTPS{{ else }}HTTP{{ end -}}
{{- end -}}

{{/* executorPools, each merged over executorPoolDefaults, as a JSON list. */}}
{{- define "agent-reach.pools" -}}
{{- $pools := list -}}
{{- range .Values.executorPools -}}
{{- $pools = append $pools (mergeOverwrite (deepCopy $.Values.executorPoolDefaults) (deepCopy .)) -}}
{{- end -}}
{{- toJson $pools -}}
{{- end -}}
