{{/* The chart's name: the app.kubernetes.io/name of the operator objects. */}}
{{- define "fsdp-operator.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/*
Object names: the release name when it already says "fsdp-operator" (so the
default release name gives the same names as kustomize/default), else
<release>-fsdp-operator.
*/}}
{{- define "fsdp-operator.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* Labels of every object; kustomize/default sets the same minus Helm's own. */}}
{{- define "fsdp-operator.labels" -}}
app.kubernetes.io/name: {{ include "fsdp-operator.name" . }}
app.kubernetes.io/part-of: fsdp-k8s
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{/* Selects the operator pod; instance keeps two releases apart. */}}
{{- define "fsdp-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "fsdp-operator.name" . }}
app.kubernetes.io/component: operator
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "fsdp-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "fsdp-operator.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create=false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* Only Helm's own labels: for objects whose other labels come from the kustomize files. */}}
{{- define "fsdp-operator.helmLabels" -}}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{/* Labels added to the monitoring objects: Helm's, plus the user's (monitoring.labels). */}}
{{- define "fsdp-operator.monitoringLabels" -}}
{{ include "fsdp-operator.helmLabels" . }}
{{- with .Values.monitoring.labels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/*
One object of kustomize/components/monitoring, read from files/ (links to
those files): its kind, name, labels and spec are kept, Helm's labels and
the release namespace are added. Argument: (list $ "files/monitoring/x.yaml").
*/}}
{{- define "fsdp-operator.monitoringObject" -}}
{{- $root := index . 0 -}}
{{- $obj := $root.Files.Get (index . 1) | fromYaml -}}
{{- $labels := merge (include "fsdp-operator.monitoringLabels" $root | fromYaml) ($obj.metadata.labels | default dict) -}}
apiVersion: {{ $obj.apiVersion }}
kind: {{ $obj.kind }}
metadata:
  name: {{ $obj.metadata.name }}
  namespace: {{ $root.Release.Namespace }}
  labels:
    {{- toYaml $labels | nindent 4 }}
spec:
  {{- toYaml $obj.spec | nindent 2 }}
{{- end -}}
