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

{{/* The tag of an image whose own tag is empty: images.tag, else the chart's appVersion. */}}
{{- define "distort.defaultTag" -}}
{{- default .Chart.AppVersion .Values.images.tag -}}
{{- end -}}

{{/* A DISTORT image, repository:tag; pass (dict "ctx" $ "image" "agent"). */}}
{{- define "distort.image" -}}
{{- $img := index .ctx.Values.images .image -}}
{{- printf "%s:%s" $img.repository (default (include "distort.defaultTag" .ctx) $img.tag) -}}
{{- end -}}

{{/* The CSI node plugin's image: csi.node.image when it names a repository, else images.csi. */}}
{{- define "distort.csiNodeImage" -}}
{{- $img := .Values.csi.node.image -}}
{{- if $img.repository -}}
{{- printf "%s:%s" $img.repository (default (include "distort.defaultTag" .) $img.tag) -}}
{{- else -}}
{{- include "distort.image" (dict "ctx" . "image" "csi") -}}
{{- end -}}
{{- end -}}

{{/*
A CSI sidecar container's image, pull policy and command; pass (dict "ctx" $ "sidecar" "<key
under .Values.sidecars>" and optionally "image" (an override of the whole reference, may be
empty)). A sidecar with a repository gets repository:(its tag, else images.tag, else appVersion),
which wins over its image. No image and no repository: DISTORT's own equivalent in the csi image
(only nodeDriverRegistrar and livenessProbe have one), pulled like the DISTORT images;
distort.sidecarModeArg then gives its --mode. A non-empty command replaces the image's entrypoint.
*/}}
{{- define "distort.sidecarImage" -}}
{{- $s := index .ctx.Values.sidecars .sidecar -}}
{{- $ref := $s.image -}}
{{- if $s.repository -}}
{{- $ref = printf "%s:%s" $s.repository (default (include "distort.defaultTag" .ctx) $s.tag) -}}
{{- end -}}
{{- $ref = default $ref .image -}}
{{- if $ref -}}
image: {{ $ref }}
{{- with .ctx.Values.sidecars.pullPolicy }}
imagePullPolicy: {{ . }}
{{- end }}
{{- else -}}
{{- if not (has .sidecar (list "nodeDriverRegistrar" "livenessProbe")) -}}
{{- fail (printf "sidecars.%s needs an image or a repository: only nodeDriverRegistrar and livenessProbe have a DISTORT equivalent in the csi image" .sidecar) -}}
{{- end -}}
image: {{ include "distort.image" (dict "ctx" .ctx "image" "csi") }}
imagePullPolicy: {{ .ctx.Values.images.pullPolicy }}
{{- end -}}
{{- with $s.command }}
command:
  {{- toYaml . | nindent 2 }}
{{- end -}}
{{- end -}}

{{/*
The first argument of a sidecar that runs DISTORT's equivalent through the csi image's entrypoint
(empty image, empty command): "- --mode=<mode>". Nothing otherwise: an upstream image takes the
upstream flags alone, and a command chosen in values carries its own mode. Pass (dict "ctx" $
"sidecar" "nodeDriverRegistrar" "mode" "registrar").
*/}}
{{- define "distort.sidecarModeArg" -}}
{{- $s := index .ctx.Values.sidecars .sidecar -}}
{{- if and (not $s.image) (not $s.repository) (not $s.command) -}}
- --mode={{ .mode }}
{{- end -}}
{{- end -}}

{{/* A sidecar's resources: its own from values when set, else `default` (the Pod's sidecar resources). */}}
{{- define "distort.sidecarResources" -}}
{{- $s := index .ctx.Values.sidecars .sidecar -}}
{{- toYaml (default .default $s.resources) -}}
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

{{/* Non-empty when the CSI controller runs csi-snapshot-metadata: snapshots on and csi.controller.snapshotMetadata.enabled. */}}
{{- define "distort.snapshotMetadataEnabled" -}}
{{- if and .Values.snapshots.enabled .Values.csi.controller.snapshotMetadata.enabled -}}true{{- end -}}
{{- end -}}

{{/* The audience snapshot metadata clients' tokens must carry: the value, else the CSI driver name. */}}
{{- define "distort.snapshotMetadataAudience" -}}
{{- default (include "distort.driverName" .) .Values.csi.controller.snapshotMetadata.audience -}}
{{- end -}}
