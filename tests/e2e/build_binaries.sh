#!/usr/bin/env bash
# Provides the control plane for tests/e2e at a pinned Kubernetes release and prints the
# folder that holds it: one line on stdout, all progress on stderr.
#
#   ASSETS=$(tests/e2e/build_binaries.sh)       # etcd kube-apiserver kube-scheduler
#                                               # kube-controller-manager kubectl
#   CRDS=$(tests/e2e/build_binaries.sh crds)    # Kueue (and JobSet) CRD YAMLs, one folder
#   KUEUE=$(tests/e2e/build_binaries.sh kueue)  # Kueue's manager (bin/kueue) and its
#                                               # webhook and manager configuration YAMLs
#   JOBSET=$(tests/e2e/build_binaries.sh jobset) # JobSet's manager (bin/jobset), likewise
#   PROMTOOL=$(tests/e2e/build_binaries.sh promtool) # bin/promtool, to check the rules in
#                                               # manifests/monitoring
#
# Binaries come from $KUBEBUILDER_ASSETS when it holds all five (the envtest convention),
# else from the cache ${TESSERA_CACHE:-$HOME/.cache/tessera}/k8s-<version>/bin, else they are
# built there with `go build` from the published Go modules. Nothing is written to the
# repository. Exit 3: nothing usable and no Go >= 1.26 to build with.
set -euo pipefail

# Newest 1.36 patch that the Go module proxy serves.
readonly K8S_VERSION=v1.36.3
# The etcd that k8s.io/kubernetes@v1.36.3's go.mod requires: the one this release is tested
# against, built by the same toolchain from the same registry as the rest.
readonly ETCD_VERSION=v3.6.8
# Newest Kueue on the proxy; it stores kueue.x-k8s.io/v1beta2.
readonly KUEUE_VERSION=v0.17.0
# The JobSet that kueue@v0.17.0's go.mod requires (the proxy serves no version list for it):
# its CRDs and its manager.
readonly JOBSET_VERSION=v0.11.1
readonly GO_MIN_MINOR=26
readonly BINARIES=(etcd kube-apiserver kube-scheduler kube-controller-manager kubectl)
readonly K8S_COMMANDS=(kube-apiserver kube-scheduler kube-controller-manager kubectl)

CACHE=${TESSERA_CACHE:-${HOME}/.cache/tessera}
WORKDIRS=()
WORK=''
CHILD=''
MODE=bin

log() {
	printf '[build_binaries %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2
}

die() {
	log "error: $1"
	exit "${2:-1}"
}

cleanup() {
	local dir
	if [[ -n "${CHILD}" ]]; then
		kill -TERM -- "-${CHILD}" 2>/dev/null || kill -TERM -- "${CHILD}" 2>/dev/null || true
		wait "${CHILD}" 2>/dev/null || true
	fi
	for dir in "${WORKDIRS[@]}"; do
		rm -rf -- "${dir}"
	done
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

usage() {
	cat <<EOF
usage: $0 [bin|crds|kueue|jobset|promtool]
  bin   (default) print the folder holding ${BINARIES[*]} (Kubernetes ${K8S_VERSION})
  crds  print the folder holding the CRD YAMLs of Kueue ${KUEUE_VERSION} and JobSet ${JOBSET_VERSION}
  kueue print the folder holding Kueue ${KUEUE_VERSION}'s manager (bin/kueue) and its webhook
        and manager configuration YAMLs (config/)
  jobset print the folder holding JobSet ${JOBSET_VERSION}'s manager (bin/jobset) and its
        webhook, manager configuration and ClusterRole YAMLs (config/)
  promtool print the folder holding promtool (bin/promtool), from Debian's prometheus package
env: KUBEBUILDER_ASSETS (use these binaries), TESSERA_CACHE (default ~/.cache/tessera)
EOF
}

missing_binaries() {
	local dir=$1 name
	for name in "${BINARIES[@]}"; do
		[[ -x "${dir}/${name}" ]] || printf '%s ' "${name}"
	done
}

holds_binaries() {
	[[ -z "$(missing_binaries "$1")" ]]
}

no_go() {
	log "$1"
	if [[ "${MODE}" == crds || "${MODE}" == kueue || "${MODE}" == jobset ]]; then
		log "${MODE} comes from Go modules: install Go >= 1.${GO_MIN_MINOR} and rerun $0 ${MODE}"
	else
		cat >&2 <<EOF
No Kubernetes control-plane binaries and no way to build them. Either:
  * set KUBEBUILDER_ASSETS to a folder holding ${BINARIES[*]}
    (Kubernetes ${K8S_VERSION}; setup-envtest's folders lack the scheduler and
    controller-manager), or
  * install Go >= 1.${GO_MIN_MINOR} and rerun $0; it builds them into ${CACHE}.
EOF
	fi
	exit 3
}

require_go() {
	command -v go >/dev/null 2>&1 || no_go "go is not on PATH"
	local version
	version=$(GOTOOLCHAIN=local go env GOVERSION) || no_go "go does not run"
	[[ "${version}" =~ go([0-9]+)\.([0-9]+) ]] || no_go "cannot read the Go version '${version}'"
	if ((BASH_REMATCH[1] == 1 && BASH_REMATCH[2] < GO_MIN_MINOR)); then
		no_go "${version} is too old: k8s.io/kubernetes ${K8S_VERSION} needs go1.${GO_MIN_MINOR}"
	fi
	log "using ${version} at $(command -v go)"
}

# Everything Go writes goes to the cache, so it survives between runs and never touches the
# repository or the user's own module cache.
go_env() {
	export GOPATH="${CACHE}/go"
	export GOMODCACHE="${GOPATH}/pkg/mod"
	export GOCACHE="${CACHE}/go-build"
	# -mod=mod: the scratch modules start without go.sum, and go fills it in (each sum checked
	# against the checksum database). -modcacherw: a plain `rm -rf` can clear the cache.
	export GOFLAGS="${GOFLAGS:+${GOFLAGS} }-mod=mod -modcacherw"
	# The toolchain was checked above; never let go try to download another.
	export GOTOOLCHAIN=local
	export GOWORK=off
	# Static binaries as Kubernetes releases them; also needs no C compiler.
	export CGO_ENABLED=0
	# Go 1.27 turns encoding/json v2 on, which makes kube-apiserver publish wrong OpenAPI
	# documents (kubectl apply then fails validation). Go 1.26 has it off: a no-op there.
	export GOEXPERIMENT="${GOEXPERIMENT:+${GOEXPERIMENT},}nojsonv2"
}

# Serialises builds sharing one cache; warm runs never get here.
take_lock() {
	mkdir -p "${CACHE}"
	exec 9>"${CACHE}/.build.lock"
	if command -v flock >/dev/null 2>&1 && ! flock -n 9; then
		log "another build holds ${CACHE}/.build.lock; waiting"
		flock 9
	fi
}

# Sets WORK to a fresh hidden folder in the cache, renamed into place only when complete, so
# an interrupted build never leaves a half cache behind (only a hidden folder that the next
# build clears; the lock says no other build is using it).
new_workdir() {
	local prefix=$1
	rm -rf -- "${CACHE}/.${prefix}".*
	WORK=$(mktemp -d "${CACHE}/.${prefix}.XXXXXX")
	WORKDIRS+=("${WORK}")
}

publish() {
	local work=$1 final=$2
	if [[ -e "${final}" ]]; then
		log "replacing incomplete ${final}"
		rm -rf -- "${final}"
	fi
	chmod 0755 "${work}"
	mv -T -- "${work}" "${final}"
}

# Prints one field of `go mod download -json` (and downloads the module). Run from the cache
# so that no go.mod around the caller is consulted or changed.
module_field() {
	local module=$1 field=$2
	(cd "${CACHE}" && go mod download -json "${module}") |
		sed -n "s/^[[:space:]]*\"${field}\": \"\\(.*\\)\",\\{0,1\\}\$/\\1/p"
}

# The go directive and godebug settings of a module's go.mod: copied into the scratch main
# module so the build keeps the GODEBUG defaults the project chose.
go_and_godebug_lines() {
	sed -n -e '/^go [0-9]/p' -e '/^godebug (/,/^)/p' -e '/^godebug [^(]/p' "$1"
}

# Staging modules that k8s.io/kubernetes requires at v0.0.0 and replaces with
# ./staging/src/...: each needs a replace to its published v0.X.Y. Modules it only replaces
# (sample-cli-plugin, sample-controller) are outside the build graph and some are not served.
staging_modules() {
	awk '
		$2 == "=>" && $3 ~ /^\.\/staging\/src\// { staged[$1] = 1 }
		$2 == "v0.0.0" { required[$1] = 1 }
		END { for (m in staged) if (m in required) print m }
	' "$1" | sort
}

write_k8s_module() {
	local dir=$1 gomod staging_version module
	gomod=$(module_field "k8s.io/kubernetes@${K8S_VERSION}" GoMod)
	[[ -f "${gomod}" ]] || die "could not download k8s.io/kubernetes@${K8S_VERSION}"
	staging_version="v0.${K8S_VERSION#v1.}"
	mkdir -p "${dir}"
	{
		printf 'module tessera.invalid/e2e/kubernetes\n\n'
		go_and_godebug_lines "${gomod}"
		printf '\nrequire k8s.io/kubernetes %s\n\nreplace (\n' "${K8S_VERSION}"
		while read -r module; do
			printf '\t%s => %s %s\n' "${module}" "${module}" "${staging_version}"
		done < <(staging_modules "${gomod}")
		printf ')\n'
	} >"${dir}/go.mod"
	grep -q '^	k8s.io/api => k8s.io/api ' "${dir}/go.mod" ||
		die "found no staging modules in ${gomod}"
}

write_etcd_module() {
	local dir=$1 gomod
	gomod=$(module_field "go.etcd.io/etcd/server/v3@${ETCD_VERSION}" GoMod)
	[[ -f "${gomod}" ]] || die "could not download go.etcd.io/etcd/server/v3@${ETCD_VERSION}"
	mkdir -p "${dir}"
	{
		printf 'module tessera.invalid/e2e/etcd\n\n'
		go_and_godebug_lines "${gomod}"
		printf '\nrequire go.etcd.io/etcd/server/v3 %s\n' "${ETCD_VERSION}"
	} >"${dir}/go.mod"
}

# What hack/lib/version.sh stamps, so --version and kubectl's version-skew checks see the
# release. The date is the release's, from the proxy, so rebuilds are byte-identical.
k8s_ldflags() {
	local info date minor package flags=(-s -w)
	info=$(module_field "k8s.io/kubernetes@${K8S_VERSION}" Info)
	date=$(sed -n 's/.*"Time": *"\([^"]*\)".*/\1/p' "${info}")
	minor=${K8S_VERSION#v1.}
	minor=${minor%%.*}
	for package in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
		flags+=(
			-X "${package}.gitVersion=${K8S_VERSION}"
			-X "${package}.gitMajor=1"
			-X "${package}.gitMinor=${minor}"
			-X "${package}.buildDate=${date:-1970-01-01T00:00:00Z}"
		)
	done
	printf '%s\n' "${flags[*]}"
}

# Runs a long command in its own process group and waits for it: bash runs a signal trap
# only between commands, so waiting here (not in the foreground) lets an interrupt stop the
# build at once, and cleanup() can end the whole group (go and its compilers).
run_child() {
	if command -v setsid >/dev/null 2>&1; then
		setsid "$@" &
	else
		"$@" &
	fi
	CHILD=$!
	wait "${CHILD}"
	CHILD=''
}

parallelism() {
	local cores
	cores=$(nproc 2>/dev/null || printf '1')
	printf '%s\n' $((cores < 2 ? cores : 2))
}

verify_binaries() {
	local dir=$1 out
	out=$("${dir}/kube-apiserver" --version)
	[[ "${out}" == "Kubernetes ${K8S_VERSION}" ]] || die "kube-apiserver --version says '${out}'"
	"${dir}/kube-scheduler" --version >/dev/null
	"${dir}/kube-controller-manager" --version >/dev/null
	"${dir}/kubectl" version --client >/dev/null
	out=$("${dir}/etcd" --version | head -n 1)
	[[ "${out}" == "etcd Version: ${ETCD_VERSION#v}" ]] || die "etcd --version says '${out}'"
}

build_binaries() {
	local work jobs ldflags package packages=() started=${SECONDS}
	new_workdir "k8s-${K8S_VERSION}"
	work=${WORK}
	jobs=$(parallelism)
	log "building Kubernetes ${K8S_VERSION} and etcd ${ETCD_VERSION} in ${work} (-p ${jobs})"

	write_k8s_module "${work}/src/kubernetes"
	write_etcd_module "${work}/src/etcd"
	for package in "${K8S_COMMANDS[@]}"; do
		packages+=("k8s.io/kubernetes/cmd/${package}")
	done
	mkdir -p "${work}/bin"
	ldflags=$(k8s_ldflags)

	log "go build ${K8S_COMMANDS[*]} (slow when cold: 10-20 minutes on 2 cores)"
	run_child nice -n 10 go -C "${work}/src/kubernetes" build -p "${jobs}" -trimpath \
		-ldflags "${ldflags}" -o "${work}/bin/" "${packages[@]}"
	log "go build etcd"
	run_child nice -n 10 go -C "${work}/src/etcd" build -p "${jobs}" -trimpath \
		-ldflags "-s -w" -o "${work}/bin/etcd" "go.etcd.io/etcd/server/v3"

	verify_binaries "${work}/bin"
	{
		printf 'kubernetes %s\netcd %s\n' "${K8S_VERSION}" "${ETCD_VERSION}"
		printf 'built with %s GOEXPERIMENT=%s on %s\n' \
			"$(go env GOVERSION)" "${GOEXPERIMENT}" "$(date -u +%Y-%m-%dT%H:%M:%SZ)"
	} >"${work}/VERSIONS"
	publish "${work}" "${CACHE}/k8s-${K8S_VERSION}"
	log "built in $((SECONDS - started)) s"
}

ensure_binaries() {
	local bin="${CACHE}/k8s-${K8S_VERSION}/bin" missing
	if [[ -n "${KUBEBUILDER_ASSETS:-}" ]]; then
		missing=$(missing_binaries "${KUBEBUILDER_ASSETS}")
		if [[ -z "${missing}" ]]; then
			log "using KUBEBUILDER_ASSETS=${KUBEBUILDER_ASSETS}"
			(cd "${KUBEBUILDER_ASSETS}" && pwd)
			return
		fi
		log "KUBEBUILDER_ASSETS=${KUBEBUILDER_ASSETS} lacks ${missing% }; using the cache"
	fi
	if ! holds_binaries "${bin}"; then
		require_go
		go_env
		take_lock
		# Another run may have finished the build while this one waited for the lock.
		holds_binaries "${bin}" || build_binaries
	fi
	printf '%s\n' "${bin}"
}

copy_crds() {
	local module=$1 into=$2 dir
	dir=$(module_field "${module}" Dir)
	[[ -d "${dir}" ]] || die "could not download ${module}"
	dir="${dir}/config/components/crd/bases"
	if ! compgen -G "${dir}/*.yaml" >/dev/null; then
		log "${module} ships no CRD YAMLs under config/components/crd/bases; skipped"
		return 1
	fi
	cp -- "${dir}"/*.yaml "${into}/" || die "could not copy the CRDs of ${module}"
	log "copied $(find "${dir}" -maxdepth 1 -name '*.yaml' | wc -l) CRDs from ${module}"
}

ensure_crds() {
	local final="${CACHE}/crds-kueue-${KUEUE_VERSION}-jobset-${JOBSET_VERSION}" work
	if [[ ! -f "${final}/kueue.x-k8s.io_clusterqueues.yaml" ]]; then
		require_go
		go_env
		take_lock
		if [[ ! -f "${final}/kueue.x-k8s.io_clusterqueues.yaml" ]]; then
			new_workdir "crds"
			work=${WORK}
			copy_crds "sigs.k8s.io/kueue@${KUEUE_VERSION}" "${work}" ||
				die "no Kueue CRDs in sigs.k8s.io/kueue@${KUEUE_VERSION}"
			grep -q '^    name: v1beta2$' "${work}/kueue.x-k8s.io_clusterqueues.yaml" ||
				die "sigs.k8s.io/kueue@${KUEUE_VERSION} does not serve kueue.x-k8s.io/v1beta2"
			copy_crds "sigs.k8s.io/jobset@${JOBSET_VERSION}" "${work}" || true
			chmod 0644 "${work}"/*.yaml
			publish "${work}" "${final}"
		fi
	fi
	printf '%s\n' "${final}"
}

# A controller manager from its published module, the way its project's Makefile builds
# bin/manager, with the same environment as the Kubernetes build (static, local toolchain,
# module cache in the cache). Kueue's and JobSet's go.mod have no replace lines, so a scratch
# module that requires the release builds it as released; the k8s.io libraries stay at the
# versions the project pins. Writes <final>/bin/<binary>, <final>/VERSIONS and copies what an
# install of the release registers (its webhooks and default manager configuration, from
# config/components, and any further files of config/components named after the minutes)
# into <final>/config.
#   build_manager <name> <module> <version> <main package> <version package> <minutes> \
#       [<file under config/components>...]
build_manager() {
	local name=$1 module=$2 version=$3 package=$4 version_pkg=$5 minutes=$6
	local extra=("${@:7}") file work dir gomod info date started=${SECONDS}
	new_workdir "${name}-${version}"
	work=${WORK}
	gomod=$(module_field "${module}@${version}" GoMod)
	dir=$(module_field "${module}@${version}" Dir)
	[[ -f "${gomod}" && -d "${dir}" ]] || die "could not download ${module}@${version}"
	info=$(module_field "${module}@${version}" Info)
	date=$(sed -n 's/.*"Time": *"\([^"]*\)".*/\1/p' "${info}")
	mkdir -p "${work}/src" "${work}/bin" "${work}/config"
	{
		printf 'module tessera.invalid/e2e/%s\n\n' "${name}"
		go_and_godebug_lines "${gomod}"
		printf '\nrequire %s %s\n' "${module}" "${version}"
	} >"${work}/src/go.mod"
	log "go build ${module} ${version} (about ${minutes} minutes cold on 2 cores)"
	run_child nice -n 10 go -C "${work}/src" build -p "$(parallelism)" -trimpath \
		-ldflags "-s -w $(manager_version_flags "${name}" "${version_pkg}" "${version}" "${date}")" \
		-o "${work}/bin/${name}" "${package}"
	cp -- "${dir}/config/components/webhook/manifests.yaml" "${work}/config/webhooks.yaml"
	cp -- "${dir}/config/components/manager/controller_manager_config.yaml" \
		"${work}/config/controller_manager_config.yaml"
	for file in "${extra[@]}"; do
		cp -- "${dir}/config/components/${file}" "${work}/config/${file##*/}"
	done
	chmod 0644 "${work}"/config/*.yaml
	printf '%s %s\nbuilt with %s on %s\n' "${name}" "${version}" "$(go env GOVERSION)" \
		"$(date -u +%Y-%m-%dT%H:%M:%SZ)" >"${work}/VERSIONS"
	publish "${work}" "${CACHE}/${name}-${version}"
	log "built ${name} in $((SECONDS - started)) s"
}

# The variables each project's Makefile stamps into its version package. JobSet's Makefile
# stamps a git commit too; the module zip has none, so the release tag stands in for it.
manager_version_flags() {
	local name=$1 version_pkg=$2 version=$3 date=$4
	case "${name}" in
	kueue)
		printf '%s\n' "-X ${version_pkg}.GitVersion=${version} -X ${version_pkg}.BuildDate=${date:-1970-01-01T00:00:00Z}"
		;;
	jobset)
		printf '%s\n' "-X ${version_pkg}.GitVersion=${version} -X ${version_pkg}.GitCommit=${version}"
		;;
	*) die "no version flags known for ${name}" ;;
	esac
}

# Whether <final> holds everything build_manager puts there for these arguments.
#   holds_manager <final> <build_manager arguments>...
holds_manager() {
	local final=$1 name=$2 file
	[[ -x "${final}/bin/${name}" && -f "${final}/config/webhooks.yaml" ]] || return 1
	for file in "${@:8}"; do
		[[ -f "${final}/config/${file##*/}" ]] || return 1
	done
}

# Prints the folder holding a manager, building it first when the cache lacks it.
#   ensure_manager <name> <version> <build_manager arguments after name>...
ensure_manager() {
	local name=$1 version=$3 final="${CACHE}/${1}-${3}"
	if ! holds_manager "${final}" "$@"; then
		require_go
		go_env
		take_lock
		# Another run may have finished the build while this one waited for the lock.
		holds_manager "${final}" "$@" || build_manager "$@"
	fi
	printf '%s\n' "${final}"
}

ensure_kueue() {
	ensure_manager kueue sigs.k8s.io/kueue "${KUEUE_VERSION}" sigs.k8s.io/kueue/cmd/kueue \
		sigs.k8s.io/kueue/pkg/version 5
}

# JobSet's main package is the root of its module (main.go), not a cmd/ folder. Its
# ClusterRoles too: the e2e stack runs it as its own ServiceAccount, with the RBAC its
# install grants, because Tessera's webhook tells the JobSet controller by its username.
ensure_jobset() {
	ensure_manager jobset sigs.k8s.io/jobset "${JOBSET_VERSION}" sigs.k8s.io/jobset \
		sigs.k8s.io/jobset/pkg/version 3 rbac/role.yaml rbac/auth_proxy_role.yaml
}

# promtool checks and unit-tests manifests/monitoring's rules. Building it from its Go module
# takes about half an hour on 2 cores; Debian's prometheus package ships the same tool (2.42,
# whose rule language the rules keep to): its promtool alone is taken from the .deb, so that no
# Prometheus server is installed or started.
readonly PROMTOOL_PACKAGE=prometheus
ensure_promtool() {
	local final="${CACHE}/promtool-debian"
	if [[ ! -x "${final}/bin/promtool" ]]; then
		command -v apt-get >/dev/null || die "promtool: no apt-get to fetch Debian's ${PROMTOOL_PACKAGE}" 3
		WORK=$(mktemp -d)
		WORKDIRS+=("${WORK}")
		log "fetching Debian's ${PROMTOOL_PACKAGE} package for its promtool"
		(cd "${WORK}" && apt-get download "${PROMTOOL_PACKAGE}" >&2) ||
			{ apt-get update >&2 && (cd "${WORK}" && apt-get download "${PROMTOOL_PACKAGE}" >&2); } ||
			die "apt-get download ${PROMTOOL_PACKAGE} failed" 3
		dpkg-deb -x "${WORK}"/"${PROMTOOL_PACKAGE}"_*.deb "${WORK}/root"
		mkdir -p "${final}/bin"
		install -m 0755 "${WORK}/root/usr/bin/promtool" "${final}/bin/promtool"
	fi
	"${final}/bin/promtool" --version >&2
	printf '%s\n' "${final}"
}

main() {
	MODE=${1:-bin}
	case "${MODE}" in
	bin) ensure_binaries ;;
	crds) ensure_crds ;;
	kueue) ensure_kueue ;;
	jobset) ensure_jobset ;;
	promtool) ensure_promtool ;;
	-h | --help) usage ;;
	*)
		usage >&2
		exit 2
		;;
	esac
}

main "$@"
