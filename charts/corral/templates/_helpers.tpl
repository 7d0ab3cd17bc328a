{{/*
Expand the name of the chart.
*/}}
{{- define "corral.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Create a default fully qualified app name.
We truncate at 63 chars because some Kubernetes name fields are limited to this (by the DNS naming spec).
If release name contains chart name it will be used as a full name.
*/}}
{{- define "corral.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/*
Create chart name and version as used by the chart label.
*/}}
{{- define "corral.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Common labels (never used in selectors: they change with every chart version).
*/}}
{{- define "corral.labels" -}}
helm.sh/chart: {{ include "corral.chart" . }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: {{ include "corral.name" . }}
{{ include "corral.selectorLabels" . }}
{{- with .Chart.AppVersion }}
app.kubernetes.io/version: {{ . | quote }}
{{- end }}
{{- with .Values.commonLabels }}
{{ tpl (toYaml .) $ }}
{{- end }}
{{- end }}

{{/*
Selector labels: only the stable app.kubernetes.io/name and /instance.
*/}}
{{- define "corral.selectorLabels" -}}
app.kubernetes.io/name: {{ include "corral.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/*
Agent labels and selector labels (component=agent).
*/}}
{{- define "corral.agent.labels" -}}
{{ include "corral.labels" . }}
app.kubernetes.io/component: agent
{{- end }}

{{- define "corral.agent.selectorLabels" -}}
{{ include "corral.selectorLabels" . }}
app.kubernetes.io/component: agent
{{- end }}

{{/*
The agent selector as the operator's --agent-selector takes it: "k=v,k=v", built from the
very labels the DaemonSet selects on, so the two can never disagree.
*/}}
{{- define "corral.agent.selectorString" -}}
{{- $labels := include "corral.agent.selectorLabels" . | fromYaml }}
{{- $pairs := list }}
{{- range $key := list "app.kubernetes.io/name" "app.kubernetes.io/instance" "app.kubernetes.io/component" }}
{{- $pairs = append $pairs (printf "%s=%s" $key (get $labels $key)) }}
{{- end }}
{{- join "," $pairs }}
{{- end }}

{{/*
Operator labels and selector labels (component=operator).
*/}}
{{- define "corral.operator.labels" -}}
{{ include "corral.labels" . }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "corral.operator.selectorLabels" -}}
{{ include "corral.selectorLabels" . }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "corral.picker.labels" -}}
{{ include "corral.labels" . }}
app.kubernetes.io/component: endpoint-picker
{{- end }}

{{- define "corral.picker.selectorLabels" -}}
{{ include "corral.selectorLabels" . }}
app.kubernetes.io/component: endpoint-picker
{{- end }}

{{/*
Names.
*/}}
{{- define "corral.agent.fullname" -}}
{{- printf "%s-agent" (include "corral.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "corral.operator.fullname" -}}
{{- printf "%s-operator" (include "corral.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "corral.picker.fullname" -}}
{{- printf "%s-picker" (include "corral.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The presets ConfigMap: a contract with the operator (--presets-configmap). */}}
{{- define "corral.presetsConfigMap" -}}
{{- printf "%s-presets" (include "corral.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Where agent.pvcMounts are mounted, each claim read-only at <root>/<claimName>: a contract with
the operator, which renders source.pvc as `model = <root>/<claimName>/<subPath>`
(operator/preset_operator/presets.py PVC_MOUNT_ROOT; the chart tests check the two agree). Not a value, since
the operator cannot follow a change, and outside /models, the agent's --models-dir, whose
scanner takes every subfolder for a model.
*/}}
{{- define "corral.pvcMountRoot" -}}
/mnt/corral/pvc
{{- end }}

{{/*
The agents' PriorityClass: the user's (agent.priorityClassName), else the chart's own when
agent.priorityClass.create, else none (the cluster default).
*/}}
{{- define "corral.agent.priorityClassName" -}}
{{- if .Values.agent.priorityClassName }}
{{- .Values.agent.priorityClassName }}
{{- else if .Values.agent.priorityClass.create }}
{{- include "corral.agent.fullname" . }}
{{- end }}
{{- end }}

{{- define "corral.agent.serviceAccountName" -}}
{{- if .Values.agent.serviceAccount.create }}
{{- default (include "corral.agent.fullname" .) .Values.agent.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.agent.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "corral.operator.serviceAccountName" -}}
{{- if .Values.operator.serviceAccount.create }}
{{- default (include "corral.operator.fullname" .) .Values.operator.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.operator.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
An image reference. Input: (dict "image" .Values.x.image "tag" "<default tag>" "global" .Values.global
"value" "<the values path of image, for the error>")
*/}}
{{- define "corral.image" -}}
{{- $repository := required (printf "%s.repository is required: no Corral image is published yet; build and push them with `make images REGISTRY=<registry> TAG=<tag>` and set %s.repository (charts/corral/README.md, Images)" .value .value) .image.repository }}
{{- $registry := default .image.registry .global.imageRegistry }}
{{- $name := ternary (printf "%s/%s" $registry $repository) $repository (ne $registry "") }}
{{- $tag := default .tag .image.tag }}
{{- if .image.digest }}
{{- printf "%s:%s@%s" $name $tag .image.digest }}
{{- else }}
{{- printf "%s:%s" $name $tag }}
{{- end }}
{{- end }}

{{- define "corral.agent.image" -}}
{{- include "corral.image" (dict "image" .Values.agent.image "tag" (printf "%s-%s" .Chart.AppVersion .Values.agent.image.variant) "global" .Values.global "value" "agent.image") }}
{{- end }}

{{- define "corral.operator.image" -}}
{{- include "corral.image" (dict "image" .Values.operator.image "tag" .Chart.AppVersion "global" .Values.global "value" "operator.image") }}
{{- end }}

{{/*
The memory ledger's margin in MiB, or "" when the ledger is off: null means 1024 whenever the
agent gets GPUs (eviction by count alone runs GPUs out of memory), off without; -1 is off.
*/}}
{{- define "corral.agent.memoryMargin" -}}
{{- $margin := .Values.agent.modelsMemoryMarginMiB }}
{{- if kindIs "invalid" $margin }}
{{- if ne .Values.agent.gpu.mode "none" }}1024{{ end }}
{{- else if ge (int $margin) 0 }}
{{- $margin }}
{{- end }}
{{- end }}

{{/*
A volume source for one of the agent's caches. Input: agent.modelCache or agent.downloadCache.
*/}}
{{- define "corral.cacheVolume" -}}
{{- if eq .type "hostPath" }}
hostPath:
  path: {{ .hostPath.path }}
  type: {{ .hostPath.type }}
{{- else if eq .type "persistentVolumeClaim" }}
persistentVolumeClaim:
  claimName: {{ .persistentVolumeClaim.claimName }}
  {{- if .persistentVolumeClaim.readOnly }}
  readOnly: true
  {{- end }}
{{- else if .emptyDir.sizeLimit }}
emptyDir:
  sizeLimit: {{ .emptyDir.sizeLimit }}
{{- else }}
emptyDir: {}
{{- end }}
{{- end }}

{{/*
Formats imagePullSecrets. Input is (dict "Values" .Values)
*/}}
{{- define "corral.imagePullSecrets" -}}
{{- range .Values.global.imagePullSecrets }}
  {{- if eq (typeOf .) "map[string]interface {}" }}
- {{ toYaml . | trim }}
  {{- else }}
- name: {{ . }}
  {{- end }}
{{- end }}
{{- end -}}

{{/*
The namespace of the ServiceMonitor.
*/}}
{{- define "corral.serviceMonitor.namespace" -}}
{{- default .Release.Namespace .Values.serviceMonitor.namespace }}
{{- end }}

{{/*
The Secret holding the agents' API key: the user's (agent.apiKey.existingSecret), else the one
the chart generates (templates/api-key-secret.yaml); "" when agent.apiKey.enabled is off.
*/}}
{{- define "corral.apiKeySecret" -}}
{{- if .Values.agent.apiKey.existingSecret }}
{{- .Values.agent.apiKey.existingSecret }}
{{- else if .Values.agent.apiKey.enabled }}
{{- printf "%s-api-key" (include "corral.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{/*
The scrape key, for the agent container only (the operator and the test pod use the API key).
Optional: an existingSecret may not hold one yet.
*/}}
{{- define "corral.metricsKeyEnv" -}}
{{- with (include "corral.apiKeySecret" .) }}
- name: CORRAL_METRICS_KEY
  valueFrom:
    secretKeyRef:
      name: {{ . }}
      key: {{ $.Values.agent.apiKey.metricsSecretKey }}
      optional: true
{{- end }}
{{- end }}

{{/*
The API key environment variable, shared by the agent, the operator (which polls the agents)
and the helm test pod. LLAMA_API_KEY is the name llama-server and the agent read.
*/}}
{{- define "corral.apiKeyEnv" -}}
{{- with (include "corral.apiKeySecret" .) }}
- name: LLAMA_API_KEY
  valueFrom:
    secretKeyRef:
      name: {{ . }}
      key: {{ $.Values.agent.apiKey.secretKey }}
{{- end }}
{{- end }}

{{/*
The Secret of the agents' TLS certificate (tls.crt, tls.key and the CA that signed it, ca.crt):
the user's (agent.tls.existingSecret), else the one the chart generates
(templates/agent-tls-secret.yaml); "" when agent.tls.enabled is off.
*/}}
{{- define "corral.agentTlsSecret" -}}
{{- if .Values.agent.tls.enabled }}
{{- default (printf "%s-tls" (include "corral.agent.fullname" .) | trunc 63 | trimSuffix "-") .Values.agent.tls.existingSecret }}
{{- end }}
{{- end }}

{{/*
The name the agents' certificate is checked by (their Service's): peers, the operator and the
ServiceMonitor reach each agent at its pod IP, which no certificate names.
*/}}
{{- define "corral.agentServerName" -}}
{{- printf "%s.%s.svc" (include "corral.agent.fullname" .) .Release.Namespace }}
{{- end }}

{{/*
An agent probe from values, over HTTPS when the agents serve it (a probe that says its
scheme keeps it).
*/}}
{{- define "corral.agentProbe" -}}
{{- $probe := deepCopy .probe }}
{{- if and .root.Values.agent.tls.enabled $probe.httpGet (not $probe.httpGet.scheme) }}
{{- $_ := set $probe.httpGet "scheme" "HTTPS" }}
{{- end }}
{{- toYaml $probe }}
{{- end }}

{{/*
The endpoint picker's plugins: a request goes to an agent that has its model or is getting it
(the agents list those models as "LoRA adapters": node_agent/api/routing_metrics.py), else to
one with room to load it; among equals, to the least queued.
*/}}
{{- define "corral.picker.plugins" -}}
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
  - type: lora-affinity-scorer
  - type: queue-scorer
  - type: max-score-picker
schedulingProfiles:
  - name: default
    plugins:
      # Above 5 times the queue's: a queue (scored 0 to 1 between the least and the most queued
      # agent) never outweighs where the model is (1) over room to load it (0.8).
      - pluginRef: lora-affinity-scorer
        weight: 10
      - pluginRef: queue-scorer
        weight: 1
      - pluginRef: max-score-picker
{{- end }}
