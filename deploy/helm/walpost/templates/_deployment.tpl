{{/*
A long-running walpost (run or inbox): its Deployment, PodDisruptionBudget and metrics
Service. Takes: root, component (relay | inbox), c (its values), command (run | inbox),
env (more variables, YAML list text).
*/}}
{{- define "walpost.deployment" -}}
{{- $root := .root }}
{{- $c := .c }}
{{- $ctx := dict "root" $root "component" .component }}
{{- $name := include "walpost.componentName" $ctx }}
apiVersion: apps/v1
kind: Deployment
metadata:
  name: {{ $name }}
  labels:
    {{- include "walpost.componentLabels" $ctx | nindent 4 }}
spec:
  replicas: {{ $c.replicas }}
  revisionHistoryLimit: 5
  strategy:
    {{- toYaml $c.strategy | nindent 4 }}
  selector:
    matchLabels:
      {{- include "walpost.selectorLabels" $ctx | nindent 6 }}
  template:
    metadata:
      labels:
        {{- include "walpost.selectorLabels" $ctx | nindent 8 }}
        {{- with $c.podLabels }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      annotations:
        # A changed configuration rolls the pods.
        checksum/config: {{ $c.config | sha256sum }}
        {{- with $c.podAnnotations }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
    spec:
      serviceAccountName: {{ include "walpost.serviceAccountName" $root }}
      automountServiceAccountToken: false
      enableServiceLinks: false
      {{- with $root.Values.imagePullSecrets }}
      imagePullSecrets:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $c.priorityClassName }}
      priorityClassName: {{ . }}
      {{- end }}
      terminationGracePeriodSeconds: {{ $c.terminationGracePeriodSeconds }}
      securityContext:
        {{- toYaml $root.Values.podSecurityContext | nindent 8 }}
      {{- if $c.topologySpreadConstraints }}
      topologySpreadConstraints:
        {{- toYaml $c.topologySpreadConstraints | nindent 8 }}
      {{- else if $c.spreadAcrossNodes }}
      topologySpreadConstraints:
        - maxSkew: 1
          topologyKey: kubernetes.io/hostname
          whenUnsatisfiable: ScheduleAnyway
          labelSelector:
            matchLabels:
              {{- include "walpost.selectorLabels" $ctx | nindent 14 }}
      {{- end }}
      {{- with $c.affinity }}
      affinity:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $c.nodeSelector }}
      nodeSelector:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $c.tolerations }}
      tolerations:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- if $c.postgres.passwordSecret.name }}
      initContainers:
        {{- with include "walpost.passwordInit" (dict "root" $root "secret" $c.postgres.passwordSecret) | trim }}{{ . | nindent 8 }}{{ end }}
      {{- end }}
      containers:
        - name: walpost
          image: {{ include "walpost.image" $root }}
          imagePullPolicy: {{ $root.Values.image.pullPolicy }}
          args:
            - {{ .command }}
            {{- range $c.extraArgs }}
            - {{ . | quote }}
            {{- end }}
          env:
            - name: WALPOST_CONFIG
              value: /etc/walpost/config/walpost.toml
            - name: WALPOST_METRICS_ADDR
              value: {{ include "walpost.metricsAddr" $root | quote }}
            {{- with include "walpost.env" (dict "root" $root "c" $c "url" $c.postgres.url "password" $c.postgres.passwordSecret) | trim }}{{ . | nindent 12 }}{{ end }}
            {{- with .env }}
            {{- . | nindent 12 }}
            {{- end }}
            {{- with $c.extraEnv }}
            {{- toYaml . | nindent 12 }}
            {{- end }}
          ports:
            - name: metrics
              containerPort: {{ $root.Values.metrics.port }}
              protocol: TCP
          # /healthz: the runtime runs (a standby's too). /readyz: 200 for a hot standby and
          # for an active instance that streams; 503 while halted and, on the active one, on
          # a critical slot alarm or when Kafka has acknowledged nothing for
          # [pipeline] unready_after_secs. The inbox: 503 while it holds no partition.
          livenessProbe:
            {{- include "walpost.probe" (dict "path" "/healthz" "p" $c.livenessProbe) | nindent 12 }}
          readinessProbe:
            {{- include "walpost.probe" (dict "path" "/readyz" "p" $c.readinessProbe) | nindent 12 }}
          resources:
            {{- toYaml $c.resources | nindent 12 }}
          securityContext:
            {{- toYaml $root.Values.containerSecurityContext | nindent 12 }}
          volumeMounts:
            - name: config
              mountPath: /etc/walpost/config
              readOnly: true
            - name: tmp
              mountPath: /tmp
            {{- with include "walpost.passwordMount" (dict "secret" $c.postgres.passwordSecret) | trim }}{{ . | nindent 12 }}{{ end }}
            {{- with include "walpost.secretMountMounts" (dict "mounts" $c.secretMounts) | trim }}{{ . | nindent 12 }}{{ end }}
            {{- with $c.extraVolumeMounts }}
            {{- toYaml . | nindent 12 }}
            {{- end }}
      volumes:
        - name: config
          configMap:
            name: {{ $name }}
        - name: tmp
          emptyDir:
            sizeLimit: 16Mi
        {{- with include "walpost.passwordVolumes" (dict "secret" $c.postgres.passwordSecret) | trim }}{{ . | nindent 8 }}{{ end }}
        {{- with include "walpost.secretMountVolumes" (dict "mounts" $c.secretMounts) | trim }}{{ . | nindent 8 }}{{ end }}
        {{- with $c.extraVolumes }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
{{- if $c.podDisruptionBudget.enabled }}
---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata:
  name: {{ $name }}
  labels:
    {{- include "walpost.componentLabels" $ctx | nindent 4 }}
spec:
  maxUnavailable: {{ $c.podDisruptionBudget.maxUnavailable }}
  unhealthyPodEvictionPolicy: {{ $c.podDisruptionBudget.unhealthyPodEvictionPolicy }}
  selector:
    matchLabels:
      {{- include "walpost.selectorLabels" $ctx | nindent 6 }}
{{- end }}
---
# For Prometheus only (walpost serves no traffic): not-ready pods are listed too, so an
# instance whose /readyz fails (a critical slot alarm, a halt) is still scraped.
apiVersion: v1
kind: Service
metadata:
  name: {{ $name }}
  labels:
    {{- include "walpost.componentLabels" $ctx | nindent 4 }}
spec:
  type: ClusterIP
  publishNotReadyAddresses: true
  selector:
    {{- include "walpost.selectorLabels" $ctx | nindent 4 }}
  ports:
    - name: metrics
      port: {{ $root.Values.metrics.port }}
      targetPort: metrics
      protocol: TCP
{{- end }}

{{- define "walpost.metricsAddr" -}}
{{- if contains ":" .Values.metrics.bindAddress }}
{{- printf "[%s]:%v" .Values.metrics.bindAddress .Values.metrics.port }}
{{- else }}
{{- printf "%s:%v" .Values.metrics.bindAddress .Values.metrics.port }}
{{- end }}
{{- end }}
