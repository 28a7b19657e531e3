{{/* Names, labels and image references shared by every DISTORT template. */}}

{{- define "distort.fullname" -}}
{{- if contains "distort" .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-distort" .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* The CSI driver name is fixed: distort-csi reports it from GetPluginInfo (csi/context.ts). */}}
{{- define "distort.driverName" -}}storage.distort.io{{- end -}}

{{- define "distort.labels" -}}
app.kubernetes.io/name: distort
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* Selector labels of one component; pass (dict "ctx" $ "component" "manager"). */}}
{{- define "distort.selector" -}}
app.kubernetes.io/name: distort
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "distort.componentLabels" -}}
{{ include "distort.labels" .ctx }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* Object name of one component: <fullname>-<component>. */}}
{{- define "distort.name" -}}
{{- printf "%s-%s" (include "distort.fullname" .ctx) .component -}}
{{- end -}}

{{- define "distort.image" -}}
{{- $img := index .ctx.Values.images .image -}}
{{- printf "%s:%s" $img.repository (default .ctx.Chart.AppVersion $img.tag) -}}
{{- end -}}

{{/* The qos.* parameters (csi/controller/qos-parameters.ts) of a StorageClass or VolumeAttributesClass, from {rwIops, rwMBps, rMBps, wMBps}. */}}
{{- define "distort.qosParameters" -}}
{{- if hasKey . "rwIops" }}
qos.rwIops: {{ .rwIops | int64 | quote }}
{{- end }}
{{- if hasKey . "rwMBps" }}
qos.rwMBps: {{ .rwMBps | int64 | quote }}
{{- end }}
{{- if hasKey . "rMBps" }}
qos.rMBps: {{ .rMBps | int64 | quote }}
{{- end }}
{{- if hasKey . "wMBps" }}
qos.wMBps: {{ .wMBps | int64 | quote }}
{{- end }}
{{- end -}}
