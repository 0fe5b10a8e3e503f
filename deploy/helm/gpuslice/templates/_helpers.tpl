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
The five configurable resource names (HAMi's keys), then gpuslice's own names of the same kinds, which
the extender and webhook always read (gpuslice.kube.codec.ResourceNames.configured). Two kinds may not
share a name. kube-scheduler calls the extender only for pods asking for one of these (managedResources).
*/}}
{{- define "gpuslice.configuredResources" -}}
{{- $names := list .Values.resourceName .Values.resourceMem .Values.resourceMemPercentage .Values.resourceCores .Values.resourcePriority -}}
{{- if ne (len $names) (len (uniq $names)) -}}
{{- fail (printf "resourceName, resourceMem, resourceMemPercentage, resourceCores and resourcePriority must differ (got %s)" (join ", " $names)) -}}
{{- end -}}
{{- toJson $names -}}
{{- end -}}

{{- define "gpuslice.managedResources" -}}
{{- $configured := include "gpuslice.configuredResources" . | fromJsonArray -}}
{{- concat $configured (list "gpuslice.io/gpu" "gpuslice.io/gpu-memory" "gpuslice.io/gpu-memory-percentage" "gpuslice.io/gpu-compute" "gpuslice.io/priority") | uniq | toJson -}}
{{- end -}}

{{/* --high-priority-namespace per allowed namespace; none at all (an empty list) is said with one empty value. */}}
{{- define "gpuslice.highPriorityFlags" -}}
{{- $ns := .Values.sharing.highPriorityNamespaces | default list }}
{{- if not (kindIs "slice" $ns) }}{{ fail "sharing.highPriorityNamespaces: a list of namespaces, or [\"*\"] for every namespace" }}{{ end }}
{{- range $ns }}
- --high-priority-namespace={{ . }}
{{- else }}
- --high-priority-namespace=
{{- end }}
{{- end -}}

{{/* Flags of `gpuslice scheduler` that the extender and the webhook must agree on. */}}
{{- define "gpuslice.schedulerFlags" -}}
{{- $_ := include "gpuslice.configuredResources" . }}
- --policy=node={{ .Values.policies.node }},gpu={{ .Values.policies.gpu }}
- --default-mem={{ .Values.defaults.memory }}
- --default-cores={{ .Values.defaults.cores }}
- --default-gpu-num={{ .Values.defaults.gpuNum }}
- --scheduler-name={{ .Values.scheduler.name }}
- --mode={{ .Values.sharing.computeMode }}
- --default-engine={{ .Values.sharing.engine | default "timeslice" }}
- --default-colocation={{ .Values.sharing.colocation | default "preemptive" }}
- --resource-name={{ .Values.resourceName }}
- --resource-mem={{ .Values.resourceMem }}
- --resource-mem-percentage={{ .Values.resourceMemPercentage }}
- --resource-cores={{ .Values.resourceCores }}
- --resource-priority={{ .Values.resourcePriority }}
{{- range .Values.scheduler.adoptSchedulers }}
- --adopt-scheduler={{ . }}
{{- end }}
{{- include "gpuslice.highPriorityFlags" . }}
- {{ if .Values.quotas.enabled }}--quotas{{ else }}--no-quotas{{ end }}
{{- end -}}
