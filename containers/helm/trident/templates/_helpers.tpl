{{/* Names and labels. */}}
{{- define "trident.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "trident.fullname" -}}
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

{{- define "trident.selectorLabels" -}}
app.kubernetes.io/name: {{ include "trident.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "trident.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "trident.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "trident.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "trident.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "trident.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository .Values.image.tag }}
{{- end }}
{{- end }}

{{/* The model repository flag: a path in the container, or the s3:// URI. */}}
{{- define "trident.repository" -}}
{{- $repo := .Values.modelRepository }}
{{- if eq $repo.source "s3" }}
{{- if not (hasPrefix "s3://" $repo.s3.uri) }}
{{- fail (printf "modelRepository.s3.uri must be an s3:// URI (s3://bucket/prefix), got %q" $repo.s3.uri) }}
{{- end }}
{{- $repo.s3.uri }}
{{- else }}
{{- $repo.mountPath }}
{{- end }}
{{- end }}

{{/* Settings that would not be honoured stop the render with the reason. */}}
{{- define "trident.validate" -}}
{{- $chartFlags := list "--model-repository" "--model-store" "--http-port" "--grpc-port" "--metrics-port" "--exit-timeout-secs" }}
{{- if gt .Values.modelRepository.pollSeconds 0.0 }}
{{- $chartFlags = concat $chartFlags (list "--model-control-mode" "--repository-poll-secs") }}
{{- end }}
{{- range .Values.extraArgs }}
{{- $arg := toString . }}
{{- range $chartFlags }}
{{- if or (eq $arg .) (hasPrefix (printf "%s=" .) $arg) }}
{{- fail (printf "extraArgs sets %s, which the chart sets itself (from ports, modelRepository or exitTimeoutSeconds): set it there" .) }}
{{- end }}
{{- end }}
{{- end }}
{{- if le (int .Values.terminationGracePeriodSeconds) (add (int .Values.preStopSleepSeconds) (int .Values.exitTimeoutSeconds)) }}
{{- fail (printf "terminationGracePeriodSeconds (%v) must exceed preStopSleepSeconds + exitTimeoutSeconds (%v): the pod would be killed during the drain" .Values.terminationGracePeriodSeconds (add (int .Values.preStopSleepSeconds) (int .Values.exitTimeoutSeconds))) }}
{{- end }}
{{- if and (eq .Values.modelRepository.source "initContainer") (not .Values.modelRepository.initContainer.image) }}
{{- fail "modelRepository.source=initContainer needs modelRepository.initContainer.image (and its command)" }}
{{- end }}
{{- if and (eq .Values.modelRepository.source "initContainer") (not .Values.modelRepository.initContainer.command) }}
{{- fail "modelRepository.source=initContainer needs modelRepository.initContainer.command (what copies the repository into the emptyDir)" }}
{{- end }}
{{- if and (eq .Values.modelRepository.source "s3") (not .Values.modelRepository.s3.credentialsSecret) }}
{{- fail "modelRepository.source=s3 needs modelRepository.s3.credentialsSecret (a Secret holding an AWS credentials file)" }}
{{- end }}
{{- if .Values.autoscaling.enabled }}
{{- if gt (int .Values.autoscaling.minReplicas) (int .Values.autoscaling.maxReplicas) }}
{{- fail (printf "autoscaling.minReplicas (%v) exceeds autoscaling.maxReplicas (%v)" .Values.autoscaling.minReplicas .Values.autoscaling.maxReplicas) }}
{{- end }}
{{- if and (not .Values.autoscaling.queueTimeMicroseconds) (not .Values.autoscaling.pendingRequests) }}
{{- fail "autoscaling.enabled needs a metric: autoscaling.queueTimeMicroseconds or autoscaling.pendingRequests" }}
{{- end }}
{{- end }}
{{- if and .Values.podDisruptionBudget.enabled (ge (int .Values.podDisruptionBudget.maxUnavailable) (int (ternary .Values.autoscaling.minReplicas .Values.replicaCount .Values.autoscaling.enabled))) }}
{{- fail (printf "podDisruptionBudget.maxUnavailable (%v) lets every replica go down at once, so it protects nothing: keep it below the (minimum) replica count or set podDisruptionBudget.enabled=false" .Values.podDisruptionBudget.maxUnavailable) }}
{{- end }}
{{- end }}
