#!/usr/bin/env bash
# Builds a real kube-apiserver (v1.20.2, Debian bookworm's source package
# `kubernetes` 1.20.5+really1.20.2) once into /var/cache/tessera-ci/k8s, and
# installs Debian's etcd. Tessera's Kubernetes integration tests and
# `tessera bench k8s` run both on loopback.
#
# Disk: only the stripped kube-apiserver binary stays in the cache; the source
# tree, GOPATH and the Go build cache live in a temporary folder that is removed
# afterwards, and apt's package cache is cleaned.
#
# With TESSERA_K8S_WITH_SCHEDULER=1 it also builds kube-scheduler from the same
# tree (for `tessera bench k8s --kube-scheduler`, which measures Kubernetes' own
# scheduler on the same machine; CI does not need it).
#
# Idempotent: a second run finds the binaries and only checks etcd.
# Prints, on its last line, the two paths the tests read:
#   TESSERA_KUBE_APISERVER=/var/cache/tessera-ci/k8s/kube-apiserver
#   TESSERA_ETCD=/usr/bin/etcd
set -euo pipefail

cache=${TESSERA_K8S_CACHE:-/var/cache/tessera-ci/k8s}
bin="$cache/kube-apiserver"
export DEBIAN_FRONTEND=noninteractive

echo "k8s-apiserver: disk before"
df -h "$(dirname "$cache")" 2>/dev/null || df -h /

if ! command -v etcd >/dev/null 2>&1 || ! command -v openssl >/dev/null 2>&1; then
    echo "k8s-apiserver: installing etcd-server and openssl (service-account key)"
    apt-get update
    apt-get install -y --no-install-recommends etcd-server openssl
    # Debian's package may start a system etcd; the tests start their own.
    (command -v systemctl >/dev/null 2>&1 && systemctl stop etcd 2>/dev/null) || true
fi

want_sched=${TESSERA_K8S_WITH_SCHEDULER:-0}
sched="$cache/kube-scheduler"
have_sched=1
if [ "$want_sched" = 1 ] && ! { [ -x "$sched" ] && "$sched" --version >/dev/null 2>&1; }; then
    have_sched=0
fi
if [ -x "$bin" ] && "$bin" --version >/dev/null 2>&1 && [ "$have_sched" = 1 ]; then
    echo "k8s-apiserver: reusing $bin ($("$bin" --version))"
else
    start=$(date +%s)
    echo "k8s-apiserver: building kube-apiserver into $bin (10-20 minutes on 2 cores)"
    if [ ! -f /etc/apt/sources.list.d/tessera-deb-src.sources ]; then
        cat > /etc/apt/sources.list.d/tessera-deb-src.sources <<'SRC'
Types: deb-src
URIs: http://deb.debian.org/debian
Suites: bookworm
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
    fi
    apt-get update
    apt-get install -y --no-install-recommends golang-go dpkg-dev \
        golang-github-modern-go-reflect2-dev ca-certificates
    work=$(mktemp -d /tmp/tessera-k8s-build.XXXXXX)
    trap 'rm -rf "$work"' EXIT
    (
        cd "$work"
        apt-get source --download-only kubernetes
        dpkg-source --no-check -x kubernetes_*.dsc src >/dev/null
        rm -f kubernetes_*
        # Kubernetes 1.20 builds in GOPATH mode (as its own hack/ scripts and
        # Debian's rules do): the tree sits at $GOPATH/src/k8s.io/kubernetes and
        # imports resolve through its vendor/ folder.
        mkdir -p gopath/src/k8s.io
        mv src gopath/src/k8s.io/kubernetes
        cd gopath/src/k8s.io/kubernetes
        # Go 1.19 cannot build the vendored reflect2 1.0.1; Debian's 1.0.2 is API-compatible.
        rm -rf vendor/github.com/modern-go/reflect2
        cp -r /usr/share/gocode/src/github.com/modern-go/reflect2 vendor/github.com/modern-go/reflect2
        export GOPATH="$work/gopath" GOCACHE="$work/gocache" GO111MODULE=off GOFLAGS= \
            GOPROXY=off CGO_ENABLED=0
        # The OpenAPI definitions are generated at build time (make's
        # gen_openapi); these are the packages that Makefile.generated_files
        # finds with a `+k8s:openapi-gen=` tag in this source version.
        go build -o "$work/openapi-gen" ./vendor/k8s.io/kube-openapi/cmd/openapi-gen
        inputs=$(sed 's|^|k8s.io/kubernetes/|' <<'DIRS' | paste -sd, -
pkg/apis/abac/v0
pkg/apis/abac/v1beta1
vendor/k8s.io/api/admission/v1
vendor/k8s.io/api/admission/v1beta1
vendor/k8s.io/api/admissionregistration/v1
vendor/k8s.io/api/admissionregistration/v1beta1
vendor/k8s.io/api/apiserverinternal/v1alpha1
vendor/k8s.io/api/apps/v1
vendor/k8s.io/api/apps/v1beta1
vendor/k8s.io/api/apps/v1beta2
vendor/k8s.io/api/authentication/v1
vendor/k8s.io/api/authentication/v1beta1
vendor/k8s.io/api/authorization/v1
vendor/k8s.io/api/authorization/v1beta1
vendor/k8s.io/api/autoscaling/v1
vendor/k8s.io/api/autoscaling/v2beta1
vendor/k8s.io/api/autoscaling/v2beta2
vendor/k8s.io/api/batch/v1
vendor/k8s.io/api/batch/v1beta1
vendor/k8s.io/api/batch/v2alpha1
vendor/k8s.io/api/certificates/v1
vendor/k8s.io/api/certificates/v1beta1
vendor/k8s.io/api/coordination/v1
vendor/k8s.io/api/coordination/v1beta1
vendor/k8s.io/api/core/v1
vendor/k8s.io/api/discovery/v1alpha1
vendor/k8s.io/api/discovery/v1beta1
vendor/k8s.io/api/events/v1
vendor/k8s.io/api/events/v1beta1
vendor/k8s.io/api/extensions/v1beta1
vendor/k8s.io/api/flowcontrol/v1alpha1
vendor/k8s.io/api/flowcontrol/v1beta1
vendor/k8s.io/api/imagepolicy/v1alpha1
vendor/k8s.io/api/networking/v1
vendor/k8s.io/api/networking/v1beta1
vendor/k8s.io/api/node/v1
vendor/k8s.io/api/node/v1alpha1
vendor/k8s.io/api/node/v1beta1
vendor/k8s.io/api/policy/v1beta1
vendor/k8s.io/api/rbac/v1
vendor/k8s.io/api/rbac/v1alpha1
vendor/k8s.io/api/rbac/v1beta1
vendor/k8s.io/api/scheduling/v1
vendor/k8s.io/api/scheduling/v1alpha1
vendor/k8s.io/api/scheduling/v1beta1
vendor/k8s.io/api/storage/v1
vendor/k8s.io/api/storage/v1alpha1
vendor/k8s.io/api/storage/v1beta1
vendor/k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1
vendor/k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1beta1
vendor/k8s.io/apimachinery/pkg/api/resource
vendor/k8s.io/apimachinery/pkg/apis/meta/v1
vendor/k8s.io/apimachinery/pkg/apis/meta/v1beta1
vendor/k8s.io/apimachinery/pkg/apis/testapigroup/v1
vendor/k8s.io/apimachinery/pkg/runtime
vendor/k8s.io/apimachinery/pkg/util/intstr
vendor/k8s.io/apimachinery/pkg/version
vendor/k8s.io/apiserver/pkg/apis/audit/v1
vendor/k8s.io/apiserver/pkg/apis/audit/v1alpha1
vendor/k8s.io/apiserver/pkg/apis/audit/v1beta1
vendor/k8s.io/apiserver/pkg/apis/example/v1
vendor/k8s.io/apiserver/pkg/apis/example2/v1
vendor/k8s.io/client-go/pkg/apis/clientauthentication/v1alpha1
vendor/k8s.io/client-go/pkg/apis/clientauthentication/v1beta1
vendor/k8s.io/client-go/pkg/version
vendor/k8s.io/cloud-provider/config/v1alpha1
vendor/k8s.io/controller-manager/config/v1alpha1
vendor/k8s.io/kube-aggregator/pkg/apis/apiregistration/v1
vendor/k8s.io/kube-aggregator/pkg/apis/apiregistration/v1beta1
vendor/k8s.io/kube-controller-manager/config/v1alpha1
vendor/k8s.io/kube-proxy/config/v1alpha1
vendor/k8s.io/kube-scheduler/config/v1
vendor/k8s.io/kube-scheduler/config/v1beta1
vendor/k8s.io/kubelet/config/v1alpha1
vendor/k8s.io/kubelet/config/v1beta1
vendor/k8s.io/metrics/pkg/apis/custom_metrics/v1beta1
vendor/k8s.io/metrics/pkg/apis/custom_metrics/v1beta2
vendor/k8s.io/metrics/pkg/apis/external_metrics/v1beta1
vendor/k8s.io/metrics/pkg/apis/metrics/v1alpha1
vendor/k8s.io/metrics/pkg/apis/metrics/v1beta1
DIRS
)
        "$work/openapi-gen" -i "$inputs" -p k8s.io/kubernetes/pkg/generated/openapi \
            -O zz_generated.openapi -h vendor/k8s.io/code-generator/hack/boilerplate.go.txt \
            -r "$work/openapi-violations.report"
        mkdir -p "$cache"
        nice go build -ldflags="-s -w" -o "$bin.tmp" ./cmd/kube-apiserver
        mv "$bin.tmp" "$bin"
        if [ "$want_sched" = 1 ]; then
            echo "k8s-apiserver: also building kube-scheduler ($(( $(date +%s) - start ))s so far)"
            nice go build -ldflags="-s -w" -o "$sched.tmp" ./cmd/kube-scheduler
            mv "$sched.tmp" "$sched"
        fi
        go clean -cache || true
    )
    rm -rf "$work"
    trap - EXIT
    apt-get clean
    echo "k8s-apiserver: built in $(( $(date +%s) - start ))s: $("$bin" --version)"
fi

echo "k8s-apiserver: disk after"
df -h "$(dirname "$cache")" 2>/dev/null || df -h /
ls -la "$cache"
echo "TESSERA_KUBE_APISERVER=$bin TESSERA_ETCD=$(command -v etcd)"
