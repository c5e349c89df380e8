{{- define "gpuplan.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}{{ .Release.Name | trunc 50 | trimSuffix "-" }}
{{- else -}}{{ printf "%s-%s" .Release.Name .Chart.Name | trunc 50 | trimSuffix "-" }}{{- end -}}
{{- end -}}

{{- define "gpuplan.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "gpuplan.selector" -}}
app.kubernetes.io/name: {{ .root.Chart.Name }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "gpuplan.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{- define "gpuplan.estimatorUrl" -}}
http://{{ include "gpuplan.fullname" . }}-estimator.{{ .Release.Namespace }}.svc:{{ int .Values.estimator.port }}
{{- end -}}

{{- /*
kube-scheduler's image for the cluster's minor version (#16): kube-scheduler must not be newer than
the API server and is expected to match its minor (kubernetes.io/releases/version-skew-policy), so
one pinned tag cannot serve every version Chart.yaml accepts. scheduler.image.tag overrides.
*/ -}}
{{- define "gpuplan.schedulerImage" -}}
{{- $image := .Values.scheduler.image -}}
{{- $minor := printf "%s.%s" .Capabilities.KubeVersion.Major (.Capabilities.KubeVersion.Minor | trimSuffix "+") -}}
{{- $tag := $image.tag | default (get $image.tagsByMinor $minor) -}}
{{- if not $tag -}}
{{- fail (printf "scheduler: no kube-scheduler image for Kubernetes %s (scheduler.image.tagsByMinor has %s); set scheduler.image.tag to the kube-scheduler of the cluster's minor version, or scheduler.enabled=false" .Capabilities.KubeVersion.Version (keys $image.tagsByMinor | sortAlpha | join ", ")) -}}
{{- end -}}
{{ $image.repository }}:{{ $tag }}
{{- end -}}

{{- define "gpuplan.peeringName" -}}
{{ .Values.operator.peering.name | default (printf "%s-operator" (include "gpuplan.fullname" .)) }}
{{- end -}}

{{- /* The restricted Pod Security profile's pod-level fields (#16), for every pod of the chart. */ -}}
{{- define "gpuplan.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
fsGroup: 65532
seccompProfile: {type: RuntimeDefault}
{{- end -}}

{{- define "gpuplan.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
capabilities: {drop: [ALL]}
seccompProfile: {type: RuntimeDefault}
{{- end -}}

{{- /* The NetworkPolicy peer allowed to scrape metrics ports. */ -}}
{{- define "gpuplan.prometheusPeer" -}}
{{- $p := .Values.networkPolicy.prometheus -}}
- {{- with $p.namespaceSelector }}
  namespaceSelector: {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $p.podSelector }}
  podSelector: {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end -}}

{{/* The audience of the operator's token for the estimator (issue #33): one source for both. */}}
{{- define "gpuplan.estimatorAudience" -}}gpuplan-estimator{{- end }}
