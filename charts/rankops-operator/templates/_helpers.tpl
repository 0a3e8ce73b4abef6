{{/* Names, labels and the RBAC rule sets shared by the templates. */}}

{{- define "rankops.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The object-name prefix: "<release>-rankops-operator"; the release name alone when it
contains the chart name; the chart name alone when the release name is its prefix. */}}
{{- define "rankops.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else if hasPrefix (printf "%s-" .Release.Name) $name }}
{{- /* release "rankops" + chart "rankops-operator": just "rankops-operator" */}}
{{- $name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "rankops.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "rankops.selectorLabels" -}}
app.kubernetes.io/name: {{ include "rankops.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "rankops.labels" -}}
helm.sh/chart: {{ include "rankops.chart" . }}
{{ include "rankops.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: rankops
{{- end }}

{{/* Labels of one component: operator, validator, monitoring. */}}
{{- define "rankops.componentLabels" -}}
{{ include "rankops.labels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "rankops.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "rankops.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name must name an existing ServiceAccount when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "rankops.validatorServiceAccountName" -}}
{{- if .Values.validator.serviceAccount.create }}
{{- default (printf "%s-validator" (include "rankops.fullname" .)) .Values.validator.serviceAccount.name }}
{{- else }}
{{- required "validator.serviceAccount.name must name an existing ServiceAccount when validator.serviceAccount.create is false" .Values.validator.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* repository:tag, or repository@digest; the tag defaults to the chart's appVersion. */}}
{{- define "rankops.image" -}}
{{- $image := .image }}
{{- if and (hasKey $image "digest") $image.digest }}
{{- printf "%s@%s" $image.repository $image.digest }}
{{- else }}
{{- printf "%s:%s" $image.repository (default .root.Chart.AppVersion $image.tag) }}
{{- end }}
{{- end }}

{{/*
"true" where ValidatingAdmissionPolicy is GA (admissionregistration.k8s.io/v1, Kubernetes 1.30+):
on 1.27-1.29 the policies are not rendered. `helm install` and `helm upgrade` read the cluster's
APIs, kinds included; `helm template` knows group/versions only (admissionregistration.k8s.io/v1
is there on 1.27 too, for webhooks), so there the Kubernetes version (--kube-version) decides.
*/}}
{{- define "rankops.admissionPolicyApi" -}}
{{- if or (.Capabilities.APIVersions.Has "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy")
          (semverCompare ">=1.30.0-0" .Capabilities.KubeVersion.Version) -}}
true
{{- end -}}
{{- end -}}

{{- define "rankops.clusterWide" -}}
{{- if not .Values.watch.namespaces }}true{{ end }}
{{- end }}

{{/* More than one replica: kopf peering (one acts, the rest stand by). */}}
{{- define "rankops.peering" -}}
{{- if gt (int .Values.operator.replicas) 1 }}true{{ end }}
{{- end }}

{{/*
RBAC rules. Split the way kopf's docs/deployment-rbac.yaml does: what the framework itself
needs, and what this application's handlers touch. No wildcards anywhere (tests/test_chart.py
fails the build on one).
*/}}

{{/* Framework (kopf) peering of the replicas, where the operator watches (cluster-wide:
ClusterKopfPeering; namespaced: a KopfPeering in each served namespace). */}}
{{- define "rankops.rules.frameworkPeering" -}}
{{- if include "rankops.peering" .root }}
# Framework: with several replicas, kopf peering decides which one acts: each patches its
# keep-alive into the peering object and watches the others'; `rankops run --peering` creates
# the object when it is missing.
- apiGroups: [kopf.dev]
  resources: [{{ .resource }}]
  verbs: [get, list, watch, create, patch]
{{- end }}
{{- end }}

{{/* Framework (kopf), cluster-scoped. */}}
{{- define "rankops.rules.frameworkCluster" -}}
# Framework: kopf discovers and watches the CRDs it serves (added or removed at runtime).
- apiGroups: [apiextensions.k8s.io]
  resources: [customresourcedefinitions]
  verbs: [get, list, watch]
{{- if not (include "rankops.clusterWide" .) }}
# Framework: with --namespace, kopf lists and watches namespaces to notice when a served one
# is created or deleted (kopf/_core/reactor/observation.py). With --all-namespaces it does not.
- apiGroups: [""]
  resources: [namespaces]
  verbs: [list, watch]
{{- end }}
{{- end }}

{{/* Framework (kopf), in every namespace it posts events to. */}}
{{- define "rankops.rules.frameworkEvents" -}}
# Framework: kopf posts an Event for every handler outcome, on the core and events.k8s.io APIs.
- apiGroups: [""]
  resources: [events]
  verbs: [create, patch]
- apiGroups: [events.k8s.io]
  resources: [events]
  verbs: [create, patch]
{{- end }}

{{/* Application, cluster-scoped: GpuNodePools and the nodes they select. */}}
{{- define "rankops.rules.appCluster" -}}
# Application: GpuNodePools are cluster-scoped. kopf patches them for its progress annotations.
- apiGroups: [rankops.io]
  resources: [gpunodepools]
  verbs: [get, list, watch, patch]
# Application: the pool's status (nodes, ready, failing by check, conditions).
- apiGroups: [rankops.io]
  resources: [gpunodepools/status]
  verbs: [get, patch]
# Application: children owned by a pool (the validator DaemonSet) carry
# blockOwnerDeletion; OwnerReferencesPermissionEnforcement (on in OpenShift) requires this.
- apiGroups: [rankops.io]
  resources: [gpunodepools/finalizers]
  verbs: [update]
# Application: pool status counts matched, ready and failing nodes from the validator's labels;
# RankingModel status explains when no ready node exists. patch only when a GpuNodePool is
# deleted: its validator is gone, so the operator clears the rankops.io labels, report annotation
# and taint it left on the pool's nodes. Never create, update or delete nodes.
- apiGroups: [""]
  resources: [nodes]
  verbs: [get, list, watch, patch]
# Application: before posting a RankingModel's Events, whether its namespace is being deleted
# (the Events would be refused, and retried at ERROR by kopf, while the namespace goes).
- apiGroups: [""]
  resources: [namespaces]
  verbs: [get]
{{- end }}

{{/* Application, in every namespace RankingModels are served in. */}}
{{- define "rankops.rules.appNamespaced" -}}
# Application: the RankingModels themselves. kopf patches them for its progress annotations.
- apiGroups: [rankops.io]
  resources: [rankingmodels]
  verbs: [get, list, watch, patch]
# Application: status (conditions, phases, gate verdicts, plan).
- apiGroups: [rankops.io]
  resources: [rankingmodels/status]
  verbs: [get, patch]
# Application: children carry ownerReferences with blockOwnerDeletion;
# OwnerReferencesPermissionEnforcement (on in OpenShift) requires update on finalizers.
- apiGroups: [rankops.io]
  resources: [rankingmodels/finalizers]
  verbs: [update]
# Application: SharedServers (several RankingModels' Triton pods), their status (each member's
# line, read by the member's own reconcile), and their children's blockOwnerDeletion (as above).
- apiGroups: [rankops.io]
  resources: [sharedservers]
  verbs: [get, list, watch]
- apiGroups: [rankops.io]
  resources: [sharedservers/status]
  verbs: [get, patch]
- apiGroups: [rankops.io]
  resources: [sharedservers/finalizers]
  verbs: [update]
# Application: a SharedServer's member Services have no selector: their EndpointSlices list the
# server's pods, ready only where the member serves; deleted when the member leaves.
- apiGroups: [discovery.k8s.io]
  resources: [endpointslices]
  verbs: [get, list, create, patch, delete]
# Application: config.pbtxt ConfigMaps and the Triton Services, applied server-side (create is
# checked when an apply creates the object); delete when a version is rolled back or retired.
- apiGroups: [""]
  resources: [configmaps, services]
  verbs: [get, list, watch, create, patch, delete]
# Application: whether the Secret a RankingModel names in spec.modelCredentialsSecret exists,
# before its fetcher pods would wait on it; read as metadata only (get, never list or watch).
# Create: each model's and each SharedServer's restricted-API key Secret (<name>-triton-api-key, a
# random key made once, owned by its object; the operator reads it back only to call that Triton's
# repository API: an in-place switch, a shared server's loads). No new reach: whoever may create
# Deployments here may already mount any Secret in a pod.
- apiGroups: [""]
  resources: [secrets]
  verbs: [get, create]
# Application: the Triton Deployments (stable and canary).
- apiGroups: [apps]
  resources: [deployments]
  verbs: [get, list, watch, create, patch, delete]
# Application: whose ReplicaSet a serving pod is, before its metrics port is read (a pod that only
# carries the model's labels is not the model's); get only, once per ReplicaSet.
- apiGroups: [apps]
  resources: [replicasets]
  verbs: [get]
# Application: each Triton track's PodDisruptionBudget (stable: replicas - failureTolerance kept
# through drains; canary and reference: never hold one up).
- apiGroups: [policy]
  resources: [poddisruptionbudgets]
  verbs: [get, list, watch, create, patch, delete]
# Application: spec.networkPolicy: the model's ingress NetworkPolicy, applied server-side; deleted
# when turned off.
- apiGroups: [networking.k8s.io]
  resources: [networkpolicies]
  verbs: [get, create, patch, delete]
# Application: spec.autoscaling mode external: which HorizontalPodAutoscaler (or KEDA's) owns the
# stable Deployment's replicas, said in status.autoscaling.external (read only, never written).
- apiGroups: [autoscaling]
  resources: [horizontalpodautoscalers]
  verbs: [get, list]
# Application: the warmup and equivalence gate Jobs.
- apiGroups: [batch]
  resources: [jobs]
  verbs: [get, list, watch, create, patch, delete]
# Application: gate verdicts are read from the gate pods' termination messages; readiness of
# serving pods decides when canary traffic may start; patch only sets the rankops.io/traffic
# label that puts a verified, Ready canary pod behind the serving Service (replicas mode).
# Never create or delete: pods belong to their Deployments and Jobs.
- apiGroups: [""]
  resources: [pods]
  verbs: [get, list, watch, patch]
{{- if .Values.traffic.gatewayApi }}
# Application (traffic.gatewayApi): exact canary weights as HTTPRoute backend weights.
- apiGroups: [gateway.networking.k8s.io]
  resources: [httproutes]
  verbs: [get, list, watch, create, patch, delete]
{{- end }}
{{- if .Values.openshift.routes }}
# Application (openshift.routes): exact canary weights through Route alternateBackends.
- apiGroups: [route.openshift.io]
  resources: [routes]
  verbs: [get, list, watch, create, patch, delete]
# Application (openshift.routes): a Route with an explicit spec.host needs this on OpenShift.
- apiGroups: [route.openshift.io]
  resources: [routes/custom-host]
  verbs: [create]
{{- end }}
{{- if .Values.monitoring.tritonServiceMonitors }}
# Application (monitoring.tritonServiceMonitors): one ServiceMonitor per RankingModel for
# Triton's metrics port (8002), applied server-side when the Prometheus Operator CRDs exist.
- apiGroups: [monitoring.coreos.com]
  resources: [servicemonitors]
  verbs: [get, list, create, patch, delete]
{{- end }}
{{- end }}

{{/* Application, in the operator's own namespace only: the validator DaemonSets. */}}
{{- define "rankops.rules.appOperatorNamespace" -}}
# Application: one validator DaemonSet per GpuNodePool, in the operator's namespace, running
# as the chart's validator ServiceAccount (the operator patches nodes only to clear a deleted
# pool's marks); deleted in the foreground when its pool is, before those marks are cleared.
- apiGroups: [apps]
  resources: [daemonsets]
  verbs: [get, list, watch, create, patch, delete]
{{- end }}
