{{- define "gpuslice.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "gpuslice.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "gpuslice.labels" -}}
app.kubernetes.io/name: {{ include "gpuslice.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "gpuslice.selector" -}}
app.kubernetes.io/name: {{ include "gpuslice.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "gpuslice.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{- define "gpuslice.agentServiceAccount" -}}{{ include "gpuslice.fullname" . }}-agent{{- end -}}
{{- define "gpuslice.schedulerServiceAccount" -}}{{ include "gpuslice.fullname" . }}-scheduler{{- end -}}
{{- define "gpuslice.certgenServiceAccount" -}}{{ include "gpuslice.fullname" . }}-certgen{{- end -}}
{{- define "gpuslice.webhookName" -}}{{ include "gpuslice.fullname" . }}-webhook{{- end -}}
{{- define "gpuslice.webhookSecret" -}}{{ include "gpuslice.fullname" . }}-webhook-tls{{- end -}}


{{/*
Every resource name the extender and webhook read (gpuslice.kube.codec.ResourceNames): HAMi's and
ours. kube-scheduler calls the extender only for pods asking for one of these (managedResources).
*/}}
{{- define "gpuslice.managedResources" -}}
{{- list "nvidia.com/gpu" "gpuslice.io/gpu" "nvidia.com/gpumem" "gpuslice.io/gpu-memory" "nvidia.com/gpumem-percentage" "gpuslice.io/gpu-memory-percentage" "nvidia.com/gpucores" "gpuslice.io/gpu-compute" "nvidia.com/priority" "gpuslice.io/priority" | toJson -}}
{{- end -}}

{{/* Flags of `gpuslice scheduler` that the extender and the webhook must agree on. */}}
{{- define "gpuslice.schedulerFlags" -}}
- --policy=node={{ .Values.policies.node }},gpu={{ .Values.policies.gpu }}
- --default-mem={{ .Values.defaults.memory }}
- --default-cores={{ .Values.defaults.cores }}
- --default-gpu-num={{ .Values.defaults.gpuNum }}
- --scheduler-name={{ .Values.scheduler.name }}
- --mode={{ .Values.sharing.computeMode }}
{{- end -}}
