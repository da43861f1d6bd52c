"""Extra volumes of the training pods and their mounts, re-modelled from Kubernetes' core types."""

from __future__ import annotations

import re
from typing import Annotated, ClassVar, Literal

from pydantic import Field, field_validator

from ..base import ApiModel
from ..contract import CONFIG_DIR, POD_MOUNTS, SHM_DIR
from ..rules import Rule
from .path_rules import DOT_SEGMENT, DOT_SEGMENT_CEL
from .values import DNS_LABEL, DNS_SUBDOMAIN, QUANTITY_PATTERN, Quantity

# Volume names the renderer uses (pod.volumes in operator/fsdp_operator/render).
RESERVED_VOLUME_NAMES = ("config", "dshm", "checkpoints", "tmp", "home")
# Mounts of ours that a user mount may not lie inside: read-only config, the
# memory-backed /dev/shm, and checkpoint.dir (the trainer rotates its contents).
NO_NESTING_MOUNTS = (CONFIG_DIR, SHM_DIR)


class PersistentVolumeClaimSource(ApiModel):
    """A PersistentVolumeClaim in the training's namespace (e.g. a data set on EBS or FSx for Lustre)."""

    claim_name: str = Field(pattern=DNS_SUBDOMAIN, max_length=253, description="Name of the claim.")
    read_only: bool | None = Field(default=None, description="Mount read-only.")


class ConfigMapSource(ApiModel):
    """A ConfigMap's keys as files."""

    name: str = Field(pattern=DNS_SUBDOMAIN, max_length=253, description="Name of the ConfigMap.")
    optional: bool | None = Field(default=None, description="Whether the ConfigMap may be missing.")


class SecretSource(ApiModel):
    """A Secret's keys as files."""

    secret_name: str = Field(pattern=DNS_SUBDOMAIN, max_length=253, description="Name of the Secret.")
    optional: bool | None = Field(default=None, description="Whether the Secret may be missing.")


class EmptyDirSource(ApiModel):
    """Scratch space that lives as long as the pod."""

    medium: Literal["", "Memory"] | None = Field(default=None, description="Memory: a tmpfs counted against memory.")
    size_limit: Quantity | None = Field(default=None, description="Size limit (e.g. 100Gi).")

    @field_validator("size_limit")
    @classmethod
    def _quantity(cls, v: int | str | None) -> str | None:
        if v is not None and not re.match(QUANTITY_PATTERN, str(v)):
            raise ValueError(f"{v!r} is not a Kubernetes quantity (e.g. 64Gi)")
        return None if v is None else str(v)


class CSISource(ApiModel):
    """An inline CSI volume (drivers that support ephemeral inline volumes, e.g. the Mountpoint for S3 driver)."""

    driver: str = Field(pattern=DNS_SUBDOMAIN, max_length=63, description="CSI driver name.")
    read_only: bool | None = Field(default=None, description="Mount read-only.")
    volume_attributes: dict[str, Annotated[str, Field(max_length=1024, description="An attribute value.")]] | None = (
        Field(default=None, max_length=32, description="Driver-specific attributes.")
    )


class NFSSource(ApiModel):
    """An NFS export (e.g. EFS by its DNS name)."""

    server: str = Field(min_length=1, max_length=253, description="NFS server host name or IP.")
    path: str = Field(min_length=1, max_length=4096, pattern=r"^/", description="Exported path.")
    read_only: bool | None = Field(default=None, description="Mount read-only.")


class Volume(ApiModel):
    """An extra volume of the training pods: exactly one source."""

    name: str = Field(pattern=DNS_LABEL, max_length=63, description="Volume name, referenced by volumeMounts.")
    persistent_volume_claim: PersistentVolumeClaimSource | None = Field(default=None, description="A PVC.")
    config_map: ConfigMapSource | None = Field(default=None, description="A ConfigMap.")
    secret: SecretSource | None = Field(default=None, description="A Secret.")
    empty_dir: EmptyDirSource | None = Field(default=None, description="An emptyDir.")
    csi: CSISource | None = Field(default=None, description="An inline CSI volume.")
    nfs: NFSSource | None = Field(default=None, description="An NFS export.")

    rules: ClassVar[tuple[Rule, ...]] = (
        Rule(
            cel=(
                "[has(self.persistentVolumeClaim), has(self.configMap), has(self.secret), has(self.emptyDir),"
                " has(self.csi), has(self.nfs)].filter(x, x).size() == 1"
            ),
            message="set exactly one source: persistentVolumeClaim, configMap, secret, emptyDir, csi or nfs",
            check=lambda v: v.source_count() == 1,
        ),
    )

    def source_count(self) -> int:
        sources = (self.persistent_volume_claim, self.config_map, self.secret, self.empty_dir, self.csi, self.nfs)
        return sum(x is not None for x in sources)


class VolumeMount(ApiModel):
    """Where an extra volume is mounted in the trainer container."""

    name: str = Field(pattern=DNS_LABEL, max_length=63, description="Name of a volume in pod.volumes.")
    mount_path: str = Field(
        max_length=1024,
        pattern=r"^(/[^/]+)+$",
        description=(
            "Absolute path (no trailing slash); not one of the pod's own mounts nor a parent of one, "
            "not inside /etc/fsdp, /dev/shm or checkpoint.dir."
        ),
    )
    read_only: bool | None = Field(default=None, description="Mount read-only.")
    sub_path: str | None = Field(
        default=None, min_length=1, max_length=1024, pattern=r"^[^/]", description="Path inside the volume to mount."
    )

    rules: ClassVar[tuple[Rule, ...]] = (
        Rule(
            # subPath may hold a "." segment (the volume's root), never "..".
            cel=(
                f"!self.mountPath.matches('{DOT_SEGMENT_CEL}')"
                r" && (!has(self.subPath) || !self.subPath.matches('(^|/)\\.\\.(/|$)'))"
            ),
            message="mountPath must not contain . or .. segments, nor subPath ..",
            field_path=".mountPath",
            check=lambda m: (
                re.search(DOT_SEGMENT, m.mount_path) is None
                and (m.sub_path is None or re.search(r"(^|/)\.\.(/|$)", m.sub_path) is None)
            ),
        ),
    )


def mounts_clash(mount_path: str, checkpoint_dir: str) -> bool:
    ours = (*POD_MOUNTS, checkpoint_dir)
    hides = any(p == mount_path or p.startswith(mount_path + "/") for p in ours)
    inside = any(mount_path.startswith(p + "/") for p in (*NO_NESTING_MOUNTS, checkpoint_dir))
    return hides or inside
