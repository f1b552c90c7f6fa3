"""The single table of every definition file's keys (layer, image, config) and of the test kinds.

These tables drive validation, defaults and the reference printed by `nodeforge schema`."""

from __future__ import annotations

from ..plan import FORMATS
from . import grammar as g
from .guard import Guarded
from .spec import AnyValue, Bool, Enum, Field, Int, ListOf, MapOf, Scalar, Str, Struct

# every string's grammar is named in builder.definitions.grammar (by where the value goes)
NAME, IDENT, PKG, ABS_PATH, MODE = g.NAME, g.IDENT, g.PKG, g.PATH, g.MODE
ENV_NAME, LABEL_KEY, MODULE, UNIT, LINE = g.ENV_NAME, g.LABEL_KEY, g.MODULE, g.UNIT, g.LINE
REQUIREMENT = Enum(("gpu", "kvm", "network"))
SCOPE = Enum(("image", "container", "boot"))
FORMAT = Enum(FORMATS)  # a node output format: builder.node.outputs has an entry for each

MATCHER = Struct({
    "contains": Field(ListOf(g.TEXT), "every one of these strings must appear", default=[]),
    "not-contains": Field(ListOf(g.TEXT), "none of these strings may appear", default=[]),
    "matches": Field(g.REGEX, "a Python regular expression searched in the text", default=None),
    "equals": Field(g.TEXT, "the whole text, stripped of surrounding white space", default=None),
}, "a text matcher (contains, not-contains, matches, equals)")

TEST_KINDS: dict[str, Struct] = {
    "file": Struct({
        "path": Field(g.PATH_TEMPLATE, "path inside the image", required=True),
        "exists": Field(Bool(), "whether it must exist", default=True),
        "type": Field(Enum(("file", "directory", "symlink")), "what it must be", default=None),
        "mode": Field(MODE, "octal permission bits", default=None),
        "owner": Field(g.OWNER, "owning user name or uid", default=None),
        "group": Field(g.OWNER, "owning group name or gid", default=None),
        "target": Field(g.LINE_TEMPLATE, "symlink target", default=None),
        "sha256": Field(Str(r"[0-9a-f]{64}", "64 hex digits"), "content digest", default=None),
        "content": Field(MATCHER, "matchers applied to the content", default=None),
    }),
    "package": Struct({
        "name": Field(PKG, "Debian package name", required=True),
        "installed": Field(Bool(), "whether dpkg must list it as installed", default=True),
        "version": Field(g.LINE_TEMPLATE, "exact version", default=None),
    }),
    "command": Struct({
        "run": Field(g.TEXT, "shell command, run with bash -c", required=True),
        "exit": Field(Int(0, 255), "expected exit status", default=0),
        "stdout": Field(MATCHER, "matchers on standard output", default=None),
        "stderr": Field(MATCHER, "matchers on standard error", default=None),
        "timeout": Field(Int(1, 3600), "seconds before the command is killed and the test fails", default=60),
        "user": Field(g.OWNER, "user to run as", default=None),
    }),
    "env": Struct({
        "name": Field(ENV_NAME, "variable name", required=True),
        "value": Field(g.LINE_TEMPLATE, "exact value", default=None),
        "contains": Field(g.LINE_TEMPLATE, "substring of the value", default=None),
        "absent": Field(Bool(), "the variable must not be set", default=False),
    }),
    "label": Struct({
        "name": Field(LABEL_KEY, "label key", required=True),
        "value": Field(g.LINE_TEMPLATE, "exact value", default=None),
        "matches": Field(g.REGEX, "regular expression", default=None),
    }),
    "service": Struct({
        "name": Field(UNIT, "unit name", required=True),
        "enabled": Field(Bool(), "enabled for multi-user.target", default=None),
        "active": Field(Bool(), "running (boot scope only)", default=None),
    }),
    "sysctl": Struct({
        "key": Field(g.SYSCTL_KEY, "sysctl key", required=True),
        "value": Field(Scalar(), "value the running kernel must report", required=True),
    }),
    "cmdline": Struct({
        "contains": Field(ListOf(g.KARG), "kernel arguments that /proc/cmdline must hold", required=True),
    }),
    "module": Struct({
        "name": Field(MODULE, "kernel module", required=True),
        "loaded": Field(Bool(), "loaded in the running kernel", default=None),
        "blacklisted": Field(Bool(), "blacklisted in the root filesystem and the initramfs", default=None),
    }),
    "entrypoint": Struct({
        "args": Field(ListOf(g.LINE_TEMPLATE), "arguments given to the image's own entrypoint (the CMD)",
                      default=[]),
        "exit": Field(Int(0, 255), "expected exit status", default=0),
        "stdout": Field(MATCHER, "matchers on standard output", default=None),
        "stderr": Field(MATCHER, "matchers on standard error", default=None),
        "timeout": Field(Int(1, 3600), "seconds before the container is killed and the test fails", default=60),
    }),
}
# where each kind of check runs when `scope` is not given
DEFAULT_SCOPE = {"file": "image", "package": "image", "env": "image", "label": "image",
                 "service": "image", "command": "container", "sysctl": "boot", "cmdline": "boot",
                 "module": "boot", "entrypoint": "container"}


def _all(kind: str) -> frozenset[str]:
    return frozenset(TEST_KINDS[kind].fields)


# per kind, the scopes where it can run and the fields each of them checks. The judges of
# builder.verify honour exactly these (a test of the unit layer shows it, field by field); a field
# set at a scope that cannot check it is a definition error, never silently ignored.
TEST_SCOPES: dict[str, dict[str, frozenset[str]]] = {
    "file": {"image": _all("file"), "container": _all("file"), "boot": _all("file")},
    "package": {"image": _all("package"), "container": _all("package"), "boot": _all("package")},
    "env": {"image": _all("env")},
    "label": {"image": _all("label")},
    "service": {"image": _all("service") - {"active"}, "boot": _all("service")},
    "command": {"container": _all("command"), "boot": _all("command")},
    "sysctl": {"boot": _all("sysctl")},
    "cmdline": {"boot": _all("cmdline")},
    "module": {"boot": _all("module")},
    "entrypoint": {"container": _all("entrypoint")},
}
ALLOWED_SCOPES = {kind: set(scopes) for kind, scopes in TEST_SCOPES.items()}
UNJUDGED = {(kind, scope): _all(kind) - fields for kind, scopes in TEST_SCOPES.items()
            for scope, fields in scopes.items()}

TEST = Struct({
    "name": Field(g.LINE_TEMPLATE, "what the test shows, in a few words", required=True),
    "scope": Field(SCOPE, "image (no exec), container (test container) or boot (booted VM)"),
    "requires": Field(ListOf(REQUIREMENT, unique=True), "hardware the test needs; skipped where absent",
                      default=[]),
    "when": Field(g.TEXT, "a template; the test is dropped when it renders false, 0 or empty", default=None),
    **{k: Field(v, f"a {k} check") for k, v in TEST_KINDS.items()},
}, "a test", one_of=tuple(TEST_KINDS))

RELEASES = ("bookworm", "trixie")  # the Debian releases an image may bootstrap
RELEASE_NAME = Str("|".join(RELEASES), "one of " + ", ".join(RELEASES))

PARAM = Struct({
    "type": Field(Enum(("int", "str", "bool", "float", *g.PARAM_TYPES, "list", "list[str]", "list[int]",
                        "list[float]", "list[bool]", *(f"list[{t}]" for t in g.PARAM_TYPES))),
                  "value type; list[T] is a list whose items have type T. path (absolute, inside the image), host, "
                  "address (IPv4, [IPv6]), url (http, https; no user:password@) and url-or-file (also file:/...) "
                  "are strings with a grammar; an empty value is allowed only where the default is empty",
                  required=True),
    "items": Field(Enum(("str", "int", "float", "bool", *g.PARAM_TYPES)), "item type of a list (type: list); "
                   "a list without it holds any scalars", default=None),
    "default": Field(AnyValue(), "default value", required=True),
    "by-release": Field(MapOf(RELEASE_NAME, AnyValue()), "the default for an image built on this Debian "
                        "release (the suite its base bootstraps); `default` for one not listed. `plan --explain` "
                        "names the release whose value applied", default=None),
    "doc": Field(g.TEXT, "what the parameter does", required=True),
    "min": Field(Int(), "smallest allowed value (int, float; each item of a list)", default=None),
    "max": Field(Int(), "largest allowed value (int, float; each item of a list)", default=None),
    "choices": Field(ListOf(Scalar()), "allowed values (each item of a list)", default=None),
    "pattern": Field(g.REGEX, "regular expression a string value (or each string item) must match, after its "
                     "type's grammar", default=None),
})

FILE = Struct({
    "path": Field(g.PATH_TEMPLATE, "destination in the image (normalised; no '..', not / itself)",
                  required=True),
    "source": Field(g.SOURCE, "template or file under files/ (symlinks must stay inside files/)"),
    "content": Field(g.TEXT, "inline content (a template)"),
    "template": Field(Bool(), "render with Jinja2 (default: true for inline content and *.j2 sources)"),
    "mode": Field(MODE, "octal mode", default="0644"),
    "owner": Field(g.OWNER, "owner", default="root"),
    "group": Field(g.OWNER, "group", default="root"),
    "when": Field(g.TEXT, "a template; the file is not written when it renders false, 0, no or empty", default=None),
    "phase": Field(Enum(("packages", "config")), "packages: written before the package installs (apt and dpkg "
                   "configuration and keyrings are, without saying so); config: after them (the default)",
                   default=None),
}, "a file", one_of=("source", "content"))

REPO = Struct({
    "name": Field(NAME, "file name under /etc/apt/sources.list.d", required=True),
    "uri": Field(g.URI, "repository URI", required=True),
    "suites": Field(ListOf(g.SUITE), "suites, e.g. bookworm or /", required=True),
    "components": Field(ListOf(g.COMPONENT), "components", default=[]),
    "key": Field(g.SOURCE, "armored or binary OpenPGP key under files/ (signature checks stay on: no Trusted, "
                 "no other option)", required=True),
})

LAYER = Struct({
    "name": Field(NAME, "the layer's name; equals its directory name", required=True),
    "summary": Field(LINE, "one line: what a GPU node gets from this layer", required=True),
    "description": Field(g.TEXT, "why, in a paragraph", default=""),
    "applies-to": Field(ListOf(Enum(("node", "container")), unique=True), "image kinds", default=["node", "container"]),
    "requires": Field(ListOf(NAME, unique=True), "layers or provided names this one needs", default=[]),
    "provides": Field(ListOf(NAME, unique=True), "virtual names this layer satisfies", default=[]),
    "conflicts": Field(ListOf(NAME, unique=True), "layers or names that cannot be in the same image", default=[]),
    "params": Field(MapOf(IDENT, PARAM), "typed parameters", default={}),
    "packages": Field(Struct({
        "apt": Field(ListOf(Guarded(PKG), unique=True), "Debian packages (templates and when: allowed)",
                     default=[]),
        "hold": Field(ListOf(Guarded(PKG), unique=True), "packages to apt-mark hold (templates and when: allowed)",
                      default=[]),
        "repos": Field(ListOf(REPO), "extra signed apt repositories", default=[]),
        "pip": Field(ListOf(g.PIP, unique=True),
                     "Python wheels (requirements such as name==1.2.*; templates allowed); exact versions and "
                     "sha256 come from the lock file", default=[]),
        "pip-target": Field(ABS_PATH, "directory the wheels are unpacked into (no pip in the image)",
                            default="/opt/nodeforge/wheels"),
    }), "packages to install", default={"apt": [], "hold": [], "repos": [], "pip": [],
                                        "pip-target": "/opt/nodeforge/wheels"}),
    "files": Field(ListOf(FILE), "files to write", default=[]),
    "sysctl": Field(MapOf(g.SYSCTL_KEY, Scalar(g.SYSCTL_VALUE)), "sysctl settings", default={}),
    "kernel": Field(Struct({
        "args": Field(ListOf(Guarded(g.KARG)), "kernel command-line arguments (templates and when: allowed)",
                      default=[]),
        "modules": Field(ListOf(Guarded(MODULE)), "modules to load at boot (templates and when: allowed)",
                         default=[]),
        "modprobe": Field(MapOf(MODULE, MapOf(g.MODULE_OPTION, Scalar(g.MODULE_OPTION_VALUE))),
                          "module options for /etc/modprobe.d", default={}),
        "blacklist": Field(ListOf(Guarded(MODULE)), "modules never to load (templates and when: allowed)",
                           default=[]),
    }), "kernel contributions", default={"args": [], "modules": [], "modprobe": {}, "blacklist": []}),
    "services": Field(Struct({
        "enable": Field(ListOf(Guarded(g.UNIT_TEMPLATE), unique=True), "units to enable (templates and when: "
                        "allowed; an item that renders empty is dropped)", default=[]),
        "disable": Field(ListOf(Guarded(g.UNIT_TEMPLATE), unique=True), "units to disable (templates and when: "
                         "allowed)", default=[]),
    }), "systemd units", default={"enable": [], "disable": []}),
    "env": Field(MapOf(ENV_NAME, Scalar()), "image environment", default={}),
    "labels": Field(MapOf(LABEL_KEY, Scalar()), "image labels", default={}),
    "entrypoint": Field(ListOf(g.LINE_TEMPLATE), "the image's ENTRYPOINT (exec form; templates allowed); kept by "
                        "images built on this one", default=None),
    "cut": Field(ABS_PATH, "a final image cut from the full one (container images): after this layer's steps the "
                 "image is this directory alone on an empty base (FROM scratch), with the image's environment "
                 "and no tool that built it; the layer's steps assemble the directory. The layer is the image's "
                 "only one, its tests are the image's (the full image's ran on the image it is cut from), and "
                 "no image builds on it", default=None),
    "users": Field(ListOf(Struct({
        "name": Field(g.USER, "user name", required=True),
        "uid": Field(Int(0, 65533), "uid (0 is root's alone)", default=None),
        "groups": Field(ListOf(g.GROUP), "supplementary groups", default=[]),
        "shell": Field(g.SHELL, "login shell", default="/bin/bash"),
        "system": Field(Bool(), "a system account", default=False),
    })), "users to create", default=[]),
    "steps": Field(ListOf(Struct({
        "name": Field(Str(r"[^#]*", "a step name (one line)", max_len=200), "what the step does", required=True),
        "run": Field(g.TEXT, "shell, run with bash -euo pipefail inside the image", required=True),
        "phase": Field(Enum(("packages", "config")), "packages: runs in the package phase, after every layer's "
                       "apt installs (for installs from a vendor repository); config: after the layer's files "
                       "(the default)", default="config"),
    })), "build-time shell: the escape hatch", default=[]),
    "asserts": Field(ListOf(Struct({
        "name": Field(NAME, "what the assertion guards, as a name", required=True),
        "that": Field(g.TEXT, "a template; the image is rejected when it renders false, 0, no or empty",
                      required=True),
        "message": Field(g.TEXT, "what is wrong (a template: name the values)", required=True),
        "remedy": Field(g.TEXT, "how to fix it (a template)", default=""),
    })), "conditions on parameter values that composing checks (versions that must match, ...)", default=[]),
    "tests": Field(ListOf(TEST), "checks that travel with the layer", default=[]),
}, "a layer definition")

DEBIAN = Struct({
    "suite": Field(Enum(RELEASES), "Debian suite", required=True),
    "mirror": Field(Str(r"https?://\S+", "an http(s) URL"), "Debian mirror", default="http://deb.debian.org/debian"),
    "security": Field(Str(r"(https?://\S+)?", "an http(s) URL or empty"),
                      "Debian security archive: SUITE-security (same components) is a source of the base beside the "
                      "mirror, so the bootstrap and every layer install security updates and the lock pins them; "
                      "empty leaves it out", default="http://deb.debian.org/debian-security"),
    "components": Field(ListOf(Enum(("main", "contrib", "non-free", "non-free-firmware")), unique=True),
                        "archive components", default=["main"]),
    "variant": Field(Enum(("minbase", "essential", "apt", "required", "important", "standard")),
                     "mmdebstrap variant", default="minbase"),
    "include": Field(ListOf(PKG, unique=True), "packages in the base itself", default=[]),
    "slim": Field(Bool(), "a slim base for container images: merged /usr by mmdebstrap's own hook "
                  "(usr-is-merged, so no usrmerge and no perl beyond perl-base), dpkg path-excludes for "
                  "documentation (copyright files kept), man and info pages and translations, written into "
                  "the base so every later install follows them; apt still installs on top", default=False),
}, "a Debian bootstrap")

LAYER_REF_VALUE = MapOf(IDENT, AnyValue())

IMAGE = Struct({
    "name": Field(NAME, "the image's name; equals its file name", required=True),
    "summary": Field(LINE, "what the image is for", required=True),
    "kind": Field(Enum(("node", "container")), "node (bootable) or container", required=True),
    "version": Field(g.VERSION, "image version (org.opencontainers.image.version)", default="0.0.0"),
    "from": Field(Struct({
        "debian": Field(DEBIAN, "bootstrap a Debian base with mmdebstrap"),
        "image": Field(NAME, "build on another image of ours"),
    }, "a base (debian or image)", one_of=("debian", "image")), "what the image starts from", required=True),
    "source-date-epoch": Field(Int(0, g.EPOCH_MAX), "SOURCE_DATE_EPOCH for the bootstrap and the created label "
                               "(32 bits: the initramfs, tar and ext4 hold it so)",
                               default=None),
    "layers": Field(ListOf(AnyValue()), "layers in order; an item is a name or {name: {param: value}}",
                    required=True),
    "outputs": Field(Struct({
        "tags": Field(ListOf(g.TAG, unique=True),
                      "engine tags", default=[]),
        "formats": Field(ListOf(FORMAT, unique=True), "node outputs", default=list(FORMATS)),
        "disk-size-mib": Field(Int(256, 1 << 20), "disk size; computed from content when unset", default=None),
    }), "what to produce", default={"tags": [], "formats": list(FORMATS), "disk-size-mib": None}),
    "env": Field(MapOf(ENV_NAME, Scalar()), "image environment", default={}),
    "labels": Field(MapOf(LABEL_KEY, Scalar()), "image labels", default={}),
    "user": Field(Str(r"[a-z_][a-z0-9_-]*|[0-9]+", "a user name or uid"),
                  "default USER of this image only (images built on it still build as root); "
                  "a layer's users creates it", default=None),
    "tests": Field(ListOf(TEST), "tests added by the image", default=[]),
}, "an image definition")

CONFIG = Struct({
    "name": Field(NAME, "the config's name; equals its file name", required=True),
    "summary": Field(LINE, "which site or cluster", required=True),
    "site": Field(Struct({
        "gpu": Field(Struct({
            "model": Field(Str(r"[A-Za-z0-9 ._()+-]*", "a GPU model name", max_len=128),
                           "GPU model, e.g. A100-SXM4-80GB", default="none"),
            "count": Field(Int(0, 64), "GPUs per node", default=0),
            "memory-mib": Field(Int(0), "memory per GPU", default=0),
        }), "GPUs per node", default={"model": "none", "count": 0, "memory-mib": 0}),
        "fabric": Field(Enum(("none", "infiniband", "roce", "nvswitch")), "interconnect", default="none"),
        "power-limit-watts": Field(Int(0, 2000), "per-GPU power limit; 0 keeps the default", default=0),
        "registry": Field(g.REGISTRY,
                          "registry to publish to", default=None),
        "cache": Field(g.CACHE_REPOSITORY, "the fleet cache: a registry repository keyed images are shared "
                       "through (`build --cache` overrides it)", default=None),
    }), "site facts, available to templates as site.*", default=None),
    "layers": Field(Struct({
        "node": Field(ListOf(NAME, unique=True), "layers added to every node image built with this config",
                      default=[]),
        "container": Field(ListOf(NAME, unique=True),
                           "layers added to every container image built with this config", default=[]),
    }), "layers this site adds, after the image's own (an image that inherits them from its parent does not "
        "add them again)", default={"node": [], "container": []}),
    "params": Field(MapOf(NAME, LAYER_REF_VALUE), "parameter values per layer", default={}),
}, "a config definition")
