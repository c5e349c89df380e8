{{- /* Object names: fullnameOverride, else <release>-<nameOverride or chart name> (the release
name alone when it already contains that name). Truncated to 50 characters, since components
append suffixes such as "-extender-metrics". The app.kubernetes.io/name label stays the chart's
name: the alerts, dashboard and operator select on app.kubernetes.io/name=gpuplan, and a
Deployment's selector cannot change on upgrade. */ -}}
{{- define "gpuplan.fullname" -}}
{{- if .Values.fullnameOverride -}}{{ .Values.fullnameOverride | trunc 50 | trimSuffix "-" }}
{{- else -}}
{{- $name := .Values.nameOverride | default .Chart.Name -}}
{{- if contains $name .Release.Name -}}{{ .Release.Name | trunc 50 | trimSuffix "-" }}
{{- else -}}{{ printf "%s-%s" .Release.Name $name | trunc 50 | trimSuffix "-" }}{{- end -}}
{{- end -}}
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

{{- /* repository:tag, or repository@digest when image.digest is set (the digest pins it). */ -}}
{{- define "gpuplan.image" -}}
{{- if .Values.image.digest -}}{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}{{- end -}}
{{- end -}}

{{- /* Pull secrets' names: global.imagePullSecrets (an umbrella chart's; names or {name}
objects) and then imagePullSecrets, each once. */ -}}
{{- define "gpuplan.pullSecretNames" -}}
{{- $names := list -}}
{{- $global := (.Values.global | default dict).imagePullSecrets | default list -}}
{{- range concat $global .Values.imagePullSecrets -}}
{{- if kindIs "string" . -}}{{ $names = append $names . }}{{- else -}}{{ $names = append $names .name }}{{- end -}}
{{- end -}}
{{- $names | compact | uniq | join "," -}}
{{- end -}}

{{- /* Placement and pull secrets shared by every Deployment's pod spec; .component is the
pod's app.kubernetes.io/component. A topologySpreadConstraints entry without a labelSelector
spreads the component's own pods. */ -}}
{{- define "gpuplan.podScheduling" -}}
{{- $root := .root -}}
{{- with include "gpuplan.pullSecretNames" $root }}
imagePullSecrets:
{{- range splitList "," . }}
  - {name: {{ . }}}
{{- end }}
{{- end }}
{{- with $root.Values.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with $root.Values.nodeSelector }}
nodeSelector: {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $root.Values.tolerations }}
tolerations: {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $root.Values.affinity }}
affinity: {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $root.Values.topologySpreadConstraints }}
{{- $selector := include "gpuplan.selector" (dict "root" $root "component" $.component) | fromYaml }}
topologySpreadConstraints:
{{- range . }}
{{- $c := deepCopy . }}
{{- if not (hasKey $c "labelSelector") }}{{ $_ := set $c "labelSelector" (dict "matchLabels" $selector) }}{{ end }}
  - {{ toYaml $c | indent 4 | trim }}
{{- end }}
{{- end }}
{{- end -}}

{{- define "gpuplan.estimatorUrl" -}}
{{ ternary "https" "http" .Values.estimator.tls.enabled }}://{{ include "gpuplan.estimatorHost" . }}:{{ int .Values.estimator.port }}
{{- end -}}

{{- define "gpuplan.estimatorHost" -}}
{{ include "gpuplan.fullname" . }}-estimator.{{ .Release.Namespace }}.svc
{{- end -}}

{{- /* The kubernetes.io/tls Secret (tls.crt, tls.key, ca.crt) the estimator serves HTTPS with. */ -}}
{{- define "gpuplan.estimatorTlsSecret" -}}
{{ .Values.estimator.tls.secretName | default (printf "%s-estimator-tls" (include "gpuplan.fullname" .)) }}
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
