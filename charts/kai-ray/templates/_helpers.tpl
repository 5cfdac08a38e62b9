{{/* Names and labels shared by every template. */}}
{{- define "kai-ray.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "kai-ray.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "kai-ray.selector" -}}
app.kubernetes.io/name: {{ .root.Chart.Name }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "kai-ray.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{- define "kai-ray.schedulerSA" -}}{{ include "kai-ray.fullname" . }}-scheduler{{- end -}}
{{- define "kai-ray.webhookSA" -}}{{ include "kai-ray.fullname" . }}-webhook{{- end -}}
{{- define "kai-ray.leaseName" -}}{{ include "kai-ray.fullname" . }}-scheduler{{- end -}}
{{- define "kai-ray.webhookService" -}}{{ include "kai-ray.fullname" . }}-webhook{{- end -}}
{{- define "kai-ray.webhookSecret" -}}{{ include "kai-ray.fullname" . }}-webhook-tls{{- end -}}
{{- define "kai-ray.webhookConfigName" -}}{{ include "kai-ray.fullname" . }}-admission{{- end -}}

{{- define "kai-ray.imagePullSecrets" -}}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
{{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}
