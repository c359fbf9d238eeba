"""Composing a sweep's Hydra config, and the config files it names, checked before Ray starts.

    cfg = compose(["sweep=smoke", "seeds=[0]"])      # conf/config.yaml + a sweep + overrides

Step 1 of ``python -m pipeline.sweep`` (docs/DESIGN.md section 1): a group selection naming a missing or
broken file is a :class:`SweepConfigError` naming the fix; ``conf_path=[folder, ...]`` adds folders of
one's own, searched after conf/ (docs/extending.md). The planner (``pipeline.sweep.plan``) reads the
group files it needs through :func:`group_option` and :func:`group_options`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence, cast

import yaml
from hydra import compose as hydra_compose
from hydra import initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig, OmegaConf

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"
GROUP_KEYS = {"method": "methods", "pair": "pairs", "dataset": "datasets"}


class SweepConfigError(ValueError):
    """A sweep configuration that cannot run; raised before Ray starts."""


def compose(overrides: Sequence[str] = (), config_dir: str | Path | None = None) -> DictConfig:
    """Compose the sweep config outside ``@hydra.main`` (tests, notebooks); leaves Hydra initialised.
    A group selection naming a missing or broken file is a :class:`SweepConfigError` (as on the command line)."""
    check_command_line(overrides, Path(config_dir or CONF_DIR))
    GlobalHydra.instance().clear()
    initialize_config_dir(config_dir=str(Path(config_dir or CONF_DIR).resolve()), version_base="1.3")
    conf_path = [o for o in overrides if o.split("=", 1)[0].lstrip("+") == "conf_path"]
    folders = OverridesParser.create().parse_overrides(conf_path)[-1].value() if conf_path else None
    return hydra_compose(config_name="config", overrides=[*overrides, *_search_path(folders)])


def _search_path(folders: Any) -> list[str]:
    """The Hydra override that searches ``conf_path``'s folders after conf/ (none when there are none)."""
    folders = [folders] if isinstance(folders, str) else list(folders or [])
    if not folders:
        return []
    return [
        "hydra.searchpath=[" + ",".join("file://" + str(Path(str(f)).expanduser().resolve()) for f in folders) + "]"
    ]


SELECTABLE_GROUPS = ("method", "pair", "dataset", "sweep", "cluster")


def _yaml_problem(path: Path) -> str | None:
    """Why ``path`` is not a usable config file (a YAML syntax error with its line, or not a mapping); None if fine."""
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        return f"{path} is not valid YAML{where}: {err.problem or err.context}"
    except (yaml.YAMLError, OSError, UnicodeDecodeError) as err:
        return f"{path} cannot be read as YAML: {err}"
    if data is not None and not isinstance(data, dict):
        return f"{path} is a YAML {type(data).__name__}, not a mapping of keys (e.g. `name: ...`)"
    return None


def check_group_file(group: str, name: str, conf_dir: Path | None = None) -> None:
    """``conf/<group>/<name>.yaml`` exists and is a YAML mapping; else a :class:`SweepConfigError` naming the fix."""
    conf = Path(conf_dir or CONF_DIR)
    path = conf / group / f"{name}.yaml"
    if not path.is_file():
        valid = sorted(str(p.relative_to(conf / group))[:-5] for p in (conf / group).rglob("*.yaml"))
        raise SweepConfigError(
            f"unknown {group} {name!r} ({group}={name}): there is no {path}; valid {group}s: {valid} "
            f"(add conf/{group}/{name}.yaml or pick one of these)"
        )
    problem = _yaml_problem(path)
    if problem:
        raise SweepConfigError(f"{group}={name}: {problem}; fix the file or pick another {group}")


def check_command_line(argv: Sequence[str], conf_dir: Path | None = None) -> None:
    """Group selections on the command line (``method=``, ``pair=``, ``dataset=``, ``sweep=``, ``cluster=``) name
    files that exist and parse, checked before Hydra composes (whose own errors are tracebacks with exit 1)."""
    args = list(argv)
    if any(
        a.lstrip("+").startswith(("hydra.searchpath", "conf_path", "--config-dir", "-cd", "--config-path", "-cp"))
        for a in args
    ):
        return  # another config tree: Hydra resolves it
    for arg in args:
        if arg.startswith("-") or "=" not in arg:
            continue
        key, value = arg.split("=", 1)
        key = key.lstrip("+")
        if key not in SELECTABLE_GROUPS:
            continue
        for name in value.split(","):
            name = name.strip().strip("'\"")
            if name and name != "null":
                check_group_file(key, name, conf_dir)


def check_conf_path(folders: Any, conf_dir: Path | None = None) -> None:
    """``conf_path``'s folders exist, and none of their config files reuses a name of conf/ or of an earlier folder.

    Hydra searches them after conf/ and silently skips a folder that is not there, and the first file of a
    name wins: a misspelt folder, or a ``method/spd.yaml`` of one's own, would run the built-in config
    without a word. Both are a :class:`SweepConfigError` naming the fix."""
    if folders is None:
        return
    if isinstance(folders, (str, Path)):
        folders = [folders]
    if not isinstance(folders, (list, tuple)) or not all(isinstance(f, (str, Path)) for f in folders):
        raise SweepConfigError(f"conf_path={folders!r}: must be a list of folders (conf_path=[/path/to/myconf])")
    seen: dict[tuple[str, str], Path] = {}
    base = Path(conf_dir or _conf_dir() or CONF_DIR)
    for group in SELECTABLE_GROUPS:
        for path in sorted((base / group).rglob("*.yaml")) if (base / group).is_dir() else ():
            seen[(group, str(path.relative_to(base / group))[:-5])] = path
    errors = []
    for entry in folders:
        folder = Path(str(entry)).expanduser().resolve()
        if not folder.is_dir():
            errors.append(
                f"conf_path folder {entry!r} does not exist ({folder}) or is not a folder: create it, fix the path, "
                "or leave it out of conf_path"
            )
            continue
        for group in SELECTABLE_GROUPS:
            if not (folder / group).is_dir():
                continue
            for path in sorted((folder / group).rglob("*.yaml")):
                name = str(path.relative_to(folder / group))[:-5]
                earlier = seen.get((group, name))
                if earlier is not None:
                    errors.append(
                        f"{path} reuses the name {group}={name} of {earlier}, which is the one Hydra would use "
                        f"(the first of a name wins): rename the file (e.g. {group}/my_{Path(name).name}.yaml)"
                    )
                else:
                    seen[(group, name)] = path
    if errors:
        raise SweepConfigError("conf_path cannot be used:\n  - " + "\n  - ".join(errors))


def group_options(group: str, cfg: DictConfig | None = None) -> list[str]:
    """The names of a config group, in conf/ and in ``cfg.conf_path``'s folders."""
    folders = cfg.get("conf_path") if cfg is not None else None
    return sorted(GlobalHydra.instance().config_loader().get_group_options(group, overrides=_search_path(folders)))


def group_option(cfg: DictConfig, group: str, name: str) -> dict[str, Any]:
    """``conf/<group>/<name>.yaml`` (or a ``conf_path`` folder's) resolved in the context of ``cfg`` (so
    ``${data_root}`` works)."""
    options = group_options(group, cfg)
    if name not in options:
        raise SweepConfigError(
            f"unknown {group} {name!r} in sweep.{GROUP_KEYS[group]}; valid {group}s: {options} "
            f"(add conf/{group}/{name}.yaml or pick one of these)"
        )
    search = _search_path(cfg.get("conf_path"))
    for folder in [_conf_dir(), *[Path(str(f)).expanduser() for f in (cfg.get("conf_path") or [])]]:
        if folder is not None and (folder / group / f"{name}.yaml").is_file():
            check_group_file(group, name, folder)
            break
    node = _composed_option(group, name, search)
    context = cast(DictConfig, OmegaConf.create(OmegaConf.to_container(cfg, resolve=False)))
    OmegaConf.set_struct(context, False)
    context[group] = node
    return cast(dict[str, Any], OmegaConf.to_container(context[group], resolve=True))


# (group, name, search path, primary folder, the folders' YAML files with their mtimes and sizes) -> the group's
# node, unresolved: Hydra composes the whole config for one group file (~0.3 s; a sweep of 7 methods asks 10 times,
# the test suite thousands); an edited, added or removed file changes the key
_COMPOSED: dict[tuple[Any, ...], Any] = {}


def _yaml_stamp(folders: Sequence[Path | None]) -> tuple[tuple[str, int, int], ...]:
    stamp = []
    for folder in folders:
        if folder is not None and folder.is_dir():
            for path in folder.rglob("*.yaml"):
                try:
                    st = path.stat()
                except OSError:
                    continue
                stamp.append((str(path), st.st_mtime_ns, st.st_size))
    return tuple(sorted(stamp))


def _composed_option(group: str, name: str, search: list[str]) -> DictConfig:
    folders = [
        _conf_dir(),
        *[Path(s.removeprefix("file://")) for o in search for s in o.split("=", 1)[1].strip("[]").split(",")],
    ]
    key = (group, name, tuple(search), str(folders[0]), _yaml_stamp(folders))
    if key not in _COMPOSED:
        try:
            node = hydra_compose(config_name="config", overrides=[f"{group}={name}", *search])[group]
        except Exception as err:  # noqa: BLE001 - Hydra/OmegaConf errors on a broken group file
            raise SweepConfigError(
                f"conf/{group}/{name}.yaml cannot be composed: {' '.join(str(err).split())[:300]}"
            ) from None
        if not isinstance(node, DictConfig):
            raise SweepConfigError(f"conf/{group}/{name}.yaml is not a mapping of keys (got {type(node).__name__})")
        _COMPOSED[key] = OmegaConf.to_container(node, resolve=False)
    return OmegaConf.create(_COMPOSED[key])


def _conf_dir() -> Path | None:
    """The config folder Hydra composes from (the primary file search path), if it is a folder."""
    try:
        sources = GlobalHydra.instance().config_loader().get_sources()
    except Exception:  # noqa: BLE001 - not initialised
        return None
    for source in sources:
        if source.scheme() == "file" and Path(source.path, "config.yaml").is_file():
            return Path(source.path)
    return None


def plain(node: Any) -> Any:
    """A plain Python value of a config node (resolved), whatever it is."""
    if isinstance(node, (DictConfig,)) or OmegaConf.is_list(node):
        return OmegaConf.to_container(node, resolve=True)
    return node


def entries(items: Any, group: str) -> list[tuple[str, dict[str, Any]]]:
    """Sweep list entries -> (config name, overrides); an entry is a name or {<group>: name, ...}."""
    out: list[tuple[str, dict[str, Any]]] = []
    for item in items or []:
        if isinstance(item, str):
            out.append((item, {}))
        elif isinstance(item, Mapping) and group in item:
            rest = {k: v for k, v in item.items() if k != group}
            out.append((str(item[group]), rest))
        else:
            raise SweepConfigError(
                f"sweep.{GROUP_KEYS[group]}: entry {item!r} must be a {group} config name or a mapping "
                f"with a `{group}:` key, e.g. {{{group}: <name>, <key>: <value>}}"
            )
    return out


def selected(cfg: DictConfig, group: str) -> list[tuple[str, dict[str, Any]]] | None:
    """A command-line selection (``method=mtad method.tau=0.3``) replacing the sweep's list."""
    node = cfg.get(group)
    if node is None:
        return None
    resolved = cast(dict[str, Any], OmegaConf.to_container(node, resolve=True))
    name = cast(str, resolved.get("name"))
    return [(name, {"__resolved__": resolved})]
