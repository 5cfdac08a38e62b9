// Wrapper module for YuniKorn's scheduler (the k8shim binary, with yunikorn-core inside). Its
// go.mod pins k8s.io/* and golang.org/x/* with replace directives, repeated here. k8shim v1.9.0
// requires yunikorn-core v1.9.0-1 and yunikorn-scheduler-interface v1.9.0-0, which the proxy
// refuses (403); their v1.9.0 release tags are served and replace them. The checksum database
// has no entry for these yunikorn modules (404), so `go mod tidy` ran with
// GONOSUMDB=github.com/apache/yunikorn-*: go.sum pins the hashes the proxy served.
module github.com/kai-ray/kai-ray/tools/peers/yunikorn

go 1.25.0

tool github.com/apache/yunikorn-k8shim/pkg/cmd/shim

require (
	cel.dev/expr v0.25.1 // indirect
	github.com/Azure/go-ntlmssp v0.1.1 // indirect
	github.com/antlr4-go/antlr/v4 v4.13.0 // indirect
	github.com/apache/yunikorn-core v1.9.0-1 // indirect
	github.com/apache/yunikorn-k8shim v1.9.0 // indirect
	github.com/apache/yunikorn-scheduler-interface v1.9.0-0 // indirect
	github.com/beorn7/perks v1.0.1 // indirect
	github.com/blang/semver/v4 v4.0.0 // indirect
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/davecgh/go-spew v1.1.2-0.20180830191138-d8f796af33cc // indirect
	github.com/emicklei/go-restful/v3 v3.12.2 // indirect
	github.com/fxamacker/cbor/v2 v2.9.0 // indirect
	github.com/go-asn1-ber/asn1-ber v1.5.8-0.20250403174932-29230038a667 // indirect
	github.com/go-ldap/ldap/v3 v3.4.13 // indirect
	github.com/go-logr/logr v1.4.3 // indirect
	github.com/go-openapi/jsonpointer v0.21.0 // indirect
	github.com/go-openapi/jsonreference v0.20.2 // indirect
	github.com/go-openapi/swag v0.23.0 // indirect
	github.com/google/btree v1.1.3 // indirect
	github.com/google/cel-go v0.26.0 // indirect
	github.com/google/gnostic-models v0.7.0 // indirect
	github.com/google/go-cmp v0.7.0 // indirect
	github.com/google/uuid v1.6.0 // indirect
	github.com/inconshreveable/mousetrap v1.1.0 // indirect
	github.com/josharian/intern v1.0.0 // indirect
	github.com/json-iterator/go v1.1.12 // indirect
	github.com/julienschmidt/httprouter v1.3.0 // indirect
	github.com/looplab/fsm v1.0.3 // indirect
	github.com/mailru/easyjson v0.7.7 // indirect
	github.com/modern-go/concurrent v0.0.0-20180306012644-bacd9c7ef1dd // indirect
	github.com/modern-go/reflect2 v1.0.3-0.20250322232337-35a7c28c31ee // indirect
	github.com/munnerz/goautoneg v0.0.0-20191010083416-a7dc8b61c822 // indirect
	github.com/petermattis/goid v0.0.0-20250904145737-900bdf8bb490 // indirect
	github.com/pmezard/go-difflib v1.0.0 // indirect
	github.com/prometheus/client_golang v1.23.2 // indirect
	github.com/prometheus/client_model v0.6.2 // indirect
	github.com/prometheus/common v0.67.5 // indirect
	github.com/prometheus/procfs v0.16.1 // indirect
	github.com/sasha-s/go-deadlock v0.3.9 // indirect
	github.com/spf13/cobra v1.10.0 // indirect
	github.com/spf13/pflag v1.0.9 // indirect
	github.com/stoewer/go-strcase v1.3.0 // indirect
	github.com/x448/float16 v0.8.4 // indirect
	go.opentelemetry.io/otel v1.43.0 // indirect
	go.opentelemetry.io/otel/trace v1.43.0 // indirect
	go.uber.org/multierr v1.11.0 // indirect
	go.uber.org/zap v1.27.1 // indirect
	go.yaml.in/yaml/v2 v2.4.3 // indirect
	go.yaml.in/yaml/v3 v3.0.4 // indirect
	golang.org/x/crypto v0.51.0 // indirect
	golang.org/x/exp v0.0.0-20260312153236-7ab1446f8b90 // indirect
	golang.org/x/net v0.54.0 // indirect
	golang.org/x/oauth2 v0.35.0 // indirect
	golang.org/x/sync v0.20.0 // indirect
	golang.org/x/sys v0.45.0 // indirect
	golang.org/x/term v0.43.0 // indirect
	golang.org/x/text v0.37.0 // indirect
	golang.org/x/time v0.15.0 // indirect
	google.golang.org/genproto/googleapis/api v0.0.0-20260209200024-4cfbd4190f57 // indirect
	google.golang.org/genproto/googleapis/rpc v0.0.0-20260226221140-a57be14db171 // indirect
	google.golang.org/grpc v1.79.3 // indirect
	google.golang.org/protobuf v1.36.11 // indirect
	gopkg.in/evanphx/json-patch.v4 v4.13.0 // indirect
	gopkg.in/inf.v0 v0.9.1 // indirect
	gopkg.in/yaml.v3 v3.0.1 // indirect
	k8s.io/api v0.35.5 // indirect
	k8s.io/apiextensions-apiserver v0.0.0 // indirect
	k8s.io/apimachinery v0.35.5 // indirect
	k8s.io/apiserver v0.35.5 // indirect
	k8s.io/client-go v0.35.5 // indirect
	k8s.io/cloud-provider v0.34.2 // indirect
	k8s.io/component-base v0.35.5 // indirect
	k8s.io/component-helpers v0.35.5 // indirect
	k8s.io/controller-manager v0.35.5 // indirect
	k8s.io/csi-translation-lib v0.34.2 // indirect
	k8s.io/dynamic-resource-allocation v0.35.5 // indirect
	k8s.io/klog/v2 v2.130.1 // indirect
	k8s.io/kube-openapi v0.0.0-20250910181357-589584f1c912 // indirect
	k8s.io/kube-scheduler v0.35.5 // indirect
	k8s.io/kubernetes v1.35.5 // indirect
	k8s.io/utils v0.0.0-20251002143259-bc988d571ff4 // indirect
	sigs.k8s.io/json v0.0.0-20250730193827-2d320260d730 // indirect
	sigs.k8s.io/randfill v1.0.0 // indirect
	sigs.k8s.io/structured-merge-diff/v6 v6.3.0 // indirect
	sigs.k8s.io/yaml v1.6.0 // indirect
)

replace (
	github.com/apache/yunikorn-core => github.com/apache/yunikorn-core v1.9.0
	github.com/apache/yunikorn-scheduler-interface => github.com/apache/yunikorn-scheduler-interface v1.9.0
	golang.org/x/crypto => golang.org/x/crypto v0.52.0
	golang.org/x/mod => golang.org/x/mod v0.36.0
	golang.org/x/net => golang.org/x/net v0.55.0
	golang.org/x/oauth2 => golang.org/x/oauth2 v0.36.0
	golang.org/x/time => golang.org/x/time v0.15.0
	k8s.io/api => k8s.io/api v0.35.5
	k8s.io/apiextensions-apiserver => k8s.io/apiextensions-apiserver v0.35.5
	k8s.io/apimachinery => k8s.io/apimachinery v0.35.5
	k8s.io/apiserver => k8s.io/apiserver v0.35.5
	k8s.io/cli-runtime => k8s.io/cli-runtime v0.35.5
	k8s.io/client-go => k8s.io/client-go v0.35.5
	k8s.io/cloud-provider => k8s.io/cloud-provider v0.35.5
	k8s.io/cluster-bootstrap => k8s.io/cluster-bootstrap v0.35.5
	k8s.io/code-generator => k8s.io/code-generator v0.35.5
	k8s.io/component-base => k8s.io/component-base v0.35.5
	k8s.io/component-helpers => k8s.io/component-helpers v0.35.5
	k8s.io/controller-manager => k8s.io/controller-manager v0.35.5
	k8s.io/cri-api => k8s.io/cri-api v0.35.5
	k8s.io/cri-client => k8s.io/cri-client v0.35.5
	k8s.io/csi-translation-lib => k8s.io/csi-translation-lib v0.35.5
	k8s.io/dynamic-resource-allocation => k8s.io/dynamic-resource-allocation v0.35.5
	k8s.io/endpointslice => k8s.io/endpointslice v0.35.5
	k8s.io/externaljwt => k8s.io/externaljwt v0.35.5
	k8s.io/klog/v2 => k8s.io/klog/v2 v2.130.1
	k8s.io/kube-aggregator => k8s.io/kube-aggregator v0.35.5
	k8s.io/kube-controller-manager => k8s.io/kube-controller-manager v0.35.5
	k8s.io/kube-proxy => k8s.io/kube-proxy v0.35.5
	k8s.io/kube-scheduler => k8s.io/kube-scheduler v0.35.5
	k8s.io/kubectl => k8s.io/kubectl v0.35.5
	k8s.io/legacy-cloud-providers => k8s.io/legacy-cloud-providers v0.35.5
	k8s.io/metrics => k8s.io/metrics v0.35.5
	k8s.io/mount-utils => k8s.io/mount-utils v0.35.5
	k8s.io/pod-security-admission => k8s.io/pod-security-admission v0.35.5
	k8s.io/sample-apiserver => k8s.io/sample-apiserver v0.35.5
	k8s.io/utils => k8s.io/utils v0.0.0-20250604170112-4c0f3b243397
)
