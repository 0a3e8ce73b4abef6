// Command sccadmit runs OpenShift's SecurityContextConstraints admission plugin (the code OpenShift's
// kube-apiserver runs, vendored from openshift/apiserver-library-go) on pods, offline.
//
//	sccadmit FILE_OR_DIR...
//
// reads YAML documents from the files (and every *.yaml in the directories): the cluster's
// SecurityContextConstraints, Namespaces (with the openshift.io/sa.scc.* annotations OpenShift's
// namespace-security-allocation controller writes), ServiceAccounts and RBAC objects (which grant
// `use` on an SCC), and pods or the workloads that make them (Deployment, ReplicaSet, StatefulSet,
// DaemonSet, Job, CronJob), also as the items of a List (`oc get ... -o yaml`); every other kind
// is skipped, so `helm template` output can go in as it is. Each pod goes through what kube-apiserver does before and during admission: defaulting, the
// ServiceAccount plugin (the default account, the token volume), then the SCC plugin's Admit and
// Validate, with the real RBAC authorizer deciding `use`. The request comes from the controller
// that creates such pods (system:serviceaccount:kube-system:replicaset-controller for a Deployment),
// or from --user for a bare Pod.
//
// Prints one JSON object a line per pod: the workload, the SCC that admitted it
// (openshift.io/scc) and the pod's security contexts after admission, or the refusal.
// Exits 0 when every pod was judged (admitted or not), 2 on bad input.
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"

	securityv1 "github.com/openshift/api/security/v1"
	"github.com/openshift/apiserver-library-go/pkg/securitycontextconstraints/sccadmission"
	securityv1listers "github.com/openshift/client-go/security/listers/security/v1"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/apiserver/pkg/admission"
	"k8s.io/apiserver/pkg/authentication/serviceaccount"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/cache"
	coreapi "k8s.io/kubernetes/pkg/apis/core"
	corev1conv "k8s.io/kubernetes/pkg/apis/core/v1"
	rbacvalidation "k8s.io/kubernetes/pkg/registry/rbac/validation"
	saadmission "k8s.io/kubernetes/plugin/pkg/admission/serviceaccount"
	rbacauthorizer "k8s.io/kubernetes/plugin/pkg/auth/authorizer/rbac"
	"sigs.k8s.io/yaml"
)

// workload is one pod to admit and who asks for it.
type workload struct {
	Kind, Name, Namespace string
	requester             user.Info
	pod                   *corev1.Pod
}

type result struct {
	Kind           string                             `json:"kind"`
	Name           string                             `json:"name"`
	Namespace      string                             `json:"namespace"`
	Requester      string                             `json:"requester"`
	ServiceAccount string                             `json:"serviceAccount"`
	Admitted       bool                               `json:"admitted"`
	SCC            string                             `json:"scc,omitempty"`
	Error          string                             `json:"error,omitempty"`
	PodSecurity    *corev1.PodSecurityContext         `json:"podSecurityContext,omitempty"`
	Containers     map[string]*corev1.SecurityContext `json:"containers,omitempty"`
}

type inputs struct {
	sccs                []*securityv1.SecurityContextConstraints
	kube                []runtime.Object // Namespaces and ServiceAccounts, for the fake clientset
	roles               []*rbacv1.Role
	roleBindings        []*rbacv1.RoleBinding
	clusterRoles        []*rbacv1.ClusterRole
	clusterRoleBindings []*rbacv1.ClusterRoleBinding
	workloads           []workload
}

// controllerUser is who kube-controller-manager creates a workload's pods as
// (--use-service-account-credentials, as OpenShift runs it); authenticated like any request.
func controllerUser(controller string) user.Info {
	sa := serviceaccount.UserInfo("kube-system", controller, "")
	return &user.DefaultInfo{Name: sa.GetName(), Groups: append(sa.GetGroups(), user.AllAuthenticated)}
}

func main() {
	userName := flag.String("user", "developer", "who creates bare Pods (member of system:authenticated)")
	flag.Usage = func() {
		fmt.Fprintf(os.Stderr, "usage: %s [--user NAME] FILE_OR_DIR...\n", os.Args[0])
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() == 0 {
		flag.Usage()
		os.Exit(2)
	}
	in := &inputs{}
	bareUser := &user.DefaultInfo{Name: *userName, Groups: []string{user.AllAuthenticated}}
	for _, arg := range flag.Args() {
		if err := in.readPath(arg, bareUser); err != nil {
			fmt.Fprintf(os.Stderr, "sccadmit: %v\n", err)
			os.Exit(2)
		}
	}
	results, err := admitAll(in)
	if err != nil {
		fmt.Fprintf(os.Stderr, "sccadmit: %v\n", err)
		os.Exit(2)
	}
	out := bufio.NewWriter(os.Stdout)
	defer out.Flush()
	enc := json.NewEncoder(out)
	for _, r := range results {
		_ = enc.Encode(r)
	}
}

func (in *inputs) readPath(path string, bareUser user.Info) error {
	info, err := os.Stat(path)
	if err != nil {
		return err
	}
	files := []string{path}
	if info.IsDir() {
		if files, err = filepath.Glob(filepath.Join(path, "*.yaml")); err != nil {
			return err
		}
		sort.Strings(files)
	}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		if err := in.read(f, data, bareUser); err != nil {
			return err
		}
	}
	return nil
}

func (in *inputs) read(file string, data []byte, bareUser user.Info) error {
	reader := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	for i := 1; ; i++ {
		doc, err := reader.Read()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("%s: %w", file, err)
		}
		if err := in.add(doc, bareUser); err != nil {
			return fmt.Errorf("%s document %d: %w", file, i, err)
		}
	}
}

// decode unmarshals a document strictly enough to catch a misspelt field in what we judge.
func decode[T any](doc []byte) (*T, error) {
	obj := new(T)
	return obj, yaml.UnmarshalStrict(doc, obj)
}

func (in *inputs) add(doc []byte, bareUser user.Info) error {
	var meta metav1.TypeMeta
	if err := yaml.Unmarshal(doc, &meta); err != nil {
		return err
	}
	template := func(kind string, om metav1.ObjectMeta, spec corev1.PodTemplateSpec, controller string) {
		pod := &corev1.Pod{ObjectMeta: spec.ObjectMeta, Spec: spec.Spec}
		pod.Name, pod.Namespace = om.Name+"-sccadmit", om.Namespace
		in.workloads = append(in.workloads, workload{kind, om.Name, om.Namespace, controllerUser(controller), pod})
	}
	var err error
	switch meta.Kind {
	case "List": // what `oc get scc,clusterrolebindings -o yaml` prints
		var list struct {
			Items []json.RawMessage `json:"items"`
		}
		if err = yaml.Unmarshal(doc, &list); err == nil {
			for i, item := range list.Items {
				if err = in.add(item, bareUser); err != nil {
					return fmt.Errorf("item %d: %w", i, err)
				}
			}
		}
	case "SecurityContextConstraints":
		var o *securityv1.SecurityContextConstraints
		if o, err = decode[securityv1.SecurityContextConstraints](doc); err == nil {
			in.sccs = append(in.sccs, o)
		}
	case "Namespace":
		var o *corev1.Namespace
		if o, err = decode[corev1.Namespace](doc); err == nil {
			in.kube = append(in.kube, o)
		}
	case "ServiceAccount":
		var o *corev1.ServiceAccount
		if o, err = decode[corev1.ServiceAccount](doc); err == nil {
			in.kube = append(in.kube, o)
		}
	case "Role":
		var o *rbacv1.Role
		if o, err = decode[rbacv1.Role](doc); err == nil {
			in.roles = append(in.roles, o)
		}
	case "RoleBinding":
		var o *rbacv1.RoleBinding
		if o, err = decode[rbacv1.RoleBinding](doc); err == nil {
			in.roleBindings = append(in.roleBindings, o)
		}
	case "ClusterRole":
		var o *rbacv1.ClusterRole
		if o, err = decode[rbacv1.ClusterRole](doc); err == nil {
			in.clusterRoles = append(in.clusterRoles, o)
		}
	case "ClusterRoleBinding":
		var o *rbacv1.ClusterRoleBinding
		if o, err = decode[rbacv1.ClusterRoleBinding](doc); err == nil {
			in.clusterRoleBindings = append(in.clusterRoleBindings, o)
		}
	case "Pod":
		var o *corev1.Pod
		if o, err = decode[corev1.Pod](doc); err == nil {
			in.workloads = append(in.workloads, workload{"Pod", o.Name, o.Namespace, bareUser, o})
		}
	case "Deployment":
		var o *appsv1.Deployment
		if o, err = decode[appsv1.Deployment](doc); err == nil {
			template(meta.Kind, o.ObjectMeta, o.Spec.Template, "replicaset-controller")
		}
	case "ReplicaSet":
		var o *appsv1.ReplicaSet
		if o, err = decode[appsv1.ReplicaSet](doc); err == nil {
			template(meta.Kind, o.ObjectMeta, o.Spec.Template, "replicaset-controller")
		}
	case "StatefulSet":
		var o *appsv1.StatefulSet
		if o, err = decode[appsv1.StatefulSet](doc); err == nil {
			template(meta.Kind, o.ObjectMeta, o.Spec.Template, "statefulset-controller")
		}
	case "DaemonSet":
		var o *appsv1.DaemonSet
		if o, err = decode[appsv1.DaemonSet](doc); err == nil {
			template(meta.Kind, o.ObjectMeta, o.Spec.Template, "daemon-set-controller")
		}
	case "Job":
		var o *batchv1.Job
		if o, err = decode[batchv1.Job](doc); err == nil {
			template(meta.Kind, o.ObjectMeta, o.Spec.Template, "job-controller")
		}
	case "CronJob":
		var o *batchv1.CronJob
		if o, err = decode[batchv1.CronJob](doc); err == nil {
			template(meta.Kind, o.ObjectMeta, o.Spec.JobTemplate.Spec.Template, "job-controller")
		}
	}
	return err
}

// sccInformer serves the SCCs read from the input as an informer that has synced; the plugin
// only asks it for its lister and HasSynced.
type sccInformer struct{ indexer cache.Indexer }

type syncedInformer struct{ cache.SharedIndexInformer }

func (syncedInformer) HasSynced() bool { return true }

func (s sccInformer) Informer() cache.SharedIndexInformer { return syncedInformer{} }
func (s sccInformer) Lister() securityv1listers.SecurityContextConstraintsLister {
	return securityv1listers.NewSecurityContextConstraintsLister(s.indexer)
}

func admitAll(in *inputs) ([]result, error) {
	indexer := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
	for _, scc := range in.sccs {
		if err := indexer.Add(scc); err != nil {
			return nil, err
		}
	}
	// The ServiceAccount controller makes "default" in every namespace.
	seen := map[string]bool{}
	kube := append([]runtime.Object{}, in.kube...)
	for _, o := range in.kube {
		if sa, ok := o.(*corev1.ServiceAccount); ok {
			seen[sa.Namespace+"/"+sa.Name] = true
		}
	}
	for _, o := range in.kube {
		if ns, ok := o.(*corev1.Namespace); ok && !seen[ns.Name+"/default"] {
			kube = append(kube, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default", Namespace: ns.Name}})
		}
	}
	client := fake.NewSimpleClientset(kube...)
	factory := informers.NewSharedInformerFactory(client, 0)

	_, staticRoles := rbacvalidation.NewTestRuleResolver(in.roles, in.roleBindings, in.clusterRoles, in.clusterRoleBindings)
	authz := rbacauthorizer.New(staticRoles, staticRoles, staticRoles, staticRoles)

	scc := sccadmission.NewConstraint()
	scc.SetSecurityInformers(sccInformer{indexer})
	scc.SetExternalKubeInformerFactory(factory)
	scc.SetAuthorizer(authz)
	if err := scc.ValidateInitialization(); err != nil {
		return nil, err
	}
	sa := saadmission.NewServiceAccount()
	sa.SetExternalKubeClientSet(client)
	sa.SetExternalKubeInformerFactory(factory)
	if err := sa.ValidateInitialization(); err != nil {
		return nil, err
	}
	stop := make(chan struct{})
	defer close(stop)
	factory.Start(stop)
	factory.WaitForCacheSync(stop)

	var results []result
	for _, w := range in.workloads {
		r, err := admit(context.Background(), w, sa, scc)
		if err != nil {
			return nil, fmt.Errorf("%s %s/%s: %w", w.Kind, w.Namespace, w.Name, err)
		}
		results = append(results, r)
	}
	return results, nil
}

type plugin interface {
	admission.MutationInterface
	admission.ValidationInterface
}

// admit does to one pod what kube-apiserver does on create: defaulting, then each admission
// plugin's mutation in order, then each one's validation.
func admit(ctx context.Context, w workload, plugins ...plugin) (result, error) {
	r := result{Kind: w.Kind, Name: w.Name, Namespace: w.Namespace, Requester: w.requester.GetName()}
	external := w.pod.DeepCopy()
	corev1conv.SetObjectDefaults_Pod(external)
	pod := &coreapi.Pod{}
	if err := corev1conv.Convert_v1_Pod_To_core_Pod(external, pod, nil); err != nil {
		return r, err
	}
	attrs := admission.NewAttributesRecord(pod, nil, coreapi.Kind("Pod").WithVersion("v1"), pod.Namespace, pod.Name,
		coreapi.Resource("pods").WithVersion("v1"), "", admission.Create, &metav1.CreateOptions{}, false, w.requester)
	refuse := func(err error) (result, error) {
		r.ServiceAccount = pod.Spec.ServiceAccountName
		r.Error = err.Error()
		return r, nil
	}
	for _, p := range plugins {
		if err := p.Admit(ctx, attrs, nil); err != nil {
			return refuse(err)
		}
	}
	for _, p := range plugins {
		if err := p.Validate(ctx, attrs, nil); err != nil {
			return refuse(err)
		}
	}
	out := &corev1.Pod{}
	if err := corev1conv.Convert_core_Pod_To_v1_Pod(pod, out, nil); err != nil {
		return r, err
	}
	r.Admitted, r.ServiceAccount = true, out.Spec.ServiceAccountName
	r.SCC = out.Annotations[securityv1.ValidatedSCCAnnotation]
	r.PodSecurity = out.Spec.SecurityContext
	r.Containers = map[string]*corev1.SecurityContext{}
	for _, c := range append(append([]corev1.Container{}, out.Spec.InitContainers...), out.Spec.Containers...) {
		r.Containers[c.Name] = c.SecurityContext
	}
	if strings.TrimSpace(r.SCC) == "" {
		return r, fmt.Errorf("admitted without an %s annotation", securityv1.ValidatedSCCAnnotation)
	}
	return r, nil
}
