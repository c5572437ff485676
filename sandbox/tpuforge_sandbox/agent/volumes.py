"""Pod volumes materialised as host directories under the pod's directory.

ConfigMap, Secret, downwardAPI and projected volumes are written once, when the pod starts (kubelet would
refresh them; pods here are short). emptyDir is an empty directory, a PersistentVolumeClaim a directory per
claim that outlives its pods, hostPath the host path itself. Anything else (CSI, ephemeral) becomes an empty
directory and the pod gets a Warning event saying so.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tpuforge_sandbox.agent.podenv import ConfigError, Lookup, field_value

Obj = Mapping[str, Any]
Token = Callable[[str | None, int | None], str]  # (audience, expirationSeconds) -> token


@dataclass
class Volumes:
    paths: dict[str, Path] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)


def _write(dirpath: Path, rel: str, data: bytes, mode: int | None) -> None:
    target = (dirpath / rel).resolve()
    if not target.is_relative_to(dirpath.resolve()):
        raise ConfigError("FailedMount", f"volume item path {rel!r} escapes the volume")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(data)
    target.chmod((mode if mode is not None else 0o644) & 0o777)


def _key_items(dirpath: Path, kind: str, name: str, src: Obj, lookup: Lookup, default_mode: int | None) -> None:
    data = lookup(kind, name)
    if data is None:
        if src.get("optional"):
            return
        raise ConfigError("FailedMount", f'{kind.lower()} "{name}" not found')
    items = src.get("items")
    if not items:
        for key, value in data.items():
            _write(dirpath, key, value, default_mode)
        return
    for item in items:
        if item["key"] not in data:
            if src.get("optional"):
                continue
            raise ConfigError("FailedMount", f"configuration key {item['key']!r} not found in {kind} {name}")
        _write(dirpath, item["path"], data[item["key"]], item.get("mode", default_mode))


def _downward_items(dirpath: Path, pod: Obj, items: list[Obj], default_mode: int | None) -> None:
    for item in items:
        if "fieldRef" in item:
            value = field_value(pod, item["fieldRef"]["fieldPath"])
        else:
            raise ConfigError("FailedMount", f"downwardAPI item {item.get('path')}: only fieldRef is supported")
        _write(dirpath, item["path"], value.encode(), item.get("mode", default_mode))


def materialise(pod: Obj, pod_dir: Path, claims_dir: Path, lookup: Lookup, token: Token) -> Volumes:
    out = Volumes()
    vol_root = pod_dir / "volumes"
    ns = (pod.get("metadata") or {}).get("namespace", "default")
    for vol in (pod.get("spec") or {}).get("volumes") or []:
        name = vol["name"]
        path = vol_root / name
        if "hostPath" in vol:
            host = Path(vol["hostPath"]["path"])
            if vol["hostPath"].get("type") == "DirectoryOrCreate":
                host.mkdir(parents=True, exist_ok=True)
            out.paths[name] = host
            continue
        if "persistentVolumeClaim" in vol:
            claim = claims_dir / ns / vol["persistentVolumeClaim"]["claimName"]
            claim.mkdir(parents=True, exist_ok=True)
            out.paths[name] = claim
            continue
        if path.exists():
            shutil.rmtree(path)
        path.mkdir(parents=True)
        out.paths[name] = path
        if "configMap" in vol:
            src = vol["configMap"]
            _key_items(path, "ConfigMap", src["name"], src, lookup, src.get("defaultMode"))
        elif "secret" in vol:
            src = vol["secret"]
            _key_items(path, "Secret", src["secretName"], src, lookup, src.get("defaultMode"))
        elif "downwardAPI" in vol:
            src = vol["downwardAPI"]
            _downward_items(path, pod, src.get("items") or [], src.get("defaultMode"))
        elif "projected" in vol:
            mode = vol["projected"].get("defaultMode")
            for source in vol["projected"].get("sources") or []:
                if "configMap" in source:
                    s = source["configMap"]
                    _key_items(path, "ConfigMap", s["name"], s, lookup, mode)
                elif "secret" in source:
                    s = source["secret"]
                    _key_items(path, "Secret", s["name"], s, lookup, mode)
                elif "downwardAPI" in source:
                    _downward_items(path, pod, source["downwardAPI"].get("items") or [], mode)
                elif "serviceAccountToken" in source:
                    s = source["serviceAccountToken"]
                    tok = token(s.get("audience"), s.get("expirationSeconds"))
                    _write(path, s["path"], tok.encode(), mode)
        elif "emptyDir" not in vol:
            kind = next((k for k in vol if k != "name"), "unknown")
            out.warnings.append(f"volume {name!r} of type {kind} is emulated by an empty directory")
    return out
