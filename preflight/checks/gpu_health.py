"""Per-host checks of GPU health and settings (PF4xx): ECC, row remapping, PCIe width, persistence, compute mode, MIG."""

from __future__ import annotations

from collections.abc import Iterator

from preflight.checks.registry import ClusterView, host_check, host_finding
from preflight.findings import Finding, Status
from preflight.records import HostRecord


@host_check("PF401", "PF402", "PF403")
def gpu_memory_health(record: HostRecord, view: ClusterView) -> Iterator[Finding]:
    """No uncorrected ECC errors and no pending or failed row remapping."""
    for gpu in record.facts["gpu"]["devices"]:
        index = gpu["index"]
        volatile, aggregate = gpu["ecc_uncorrected_volatile"], gpu["ecc_uncorrected_aggregate"]
        if volatile:
            yield host_finding("PF401", Status.fail, record, f"GPU {index}: {volatile} uncorrected ECC error(s) since boot",
                               "drain the node; reset the GPU (`nvidia-smi -r`) and run a memory test, RMA if they recur")
        elif aggregate:
            yield host_finding("PF401", Status.warn, record, f"GPU {index}: {aggregate} uncorrected ECC error(s) in its lifetime",
                               "watch this GPU; RMA if the count grows")
        elif gpu["ecc_enabled"] is not None:
            yield host_finding("PF401", Status.passed, record, f"GPU {index}: no uncorrected ECC errors")
        if gpu["remapped_rows_failed"]:
            yield host_finding("PF403", Status.fail, record, f"GPU {index}: a row remapping failed",
                               "the GPU has run out of spare rows: drain the node and RMA the GPU")
        if gpu["remapped_rows_pending"]:
            yield host_finding("PF402", Status.fail, record, f"GPU {index}: a row remapping is pending",
                               "reset the GPU (`nvidia-smi -r -i N`, or reboot) to apply it")
        elif gpu["remapped_rows_pending"] is False:
            yield host_finding("PF402", Status.passed, record, f"GPU {index}: no row remapping pending")


@host_check("PF404", "PF405", "PF406", "PF407")
def gpu_settings(record: HostRecord, view: ClusterView) -> Iterator[Finding]:
    """PCIe link width, persistence mode, compute mode and MIG are fit for a distributed job."""
    for gpu in record.facts["gpu"]["devices"]:
        index = gpu["index"]
        width, width_max = gpu["pcie_width_current"], gpu["pcie_width_max"]
        gen, gen_max = gpu["pcie_gen_current"], gpu["pcie_gen_max"]
        if width is not None and width_max is not None and width < width_max:
            yield host_finding("PF404", Status.warn, record, f"GPU {index}: PCIe link x{width}, capable of x{width_max}",
                               "reseat the GPU or riser; a narrowed link cuts host-device and GPUDirect bandwidth")
        elif width is not None and gen is not None:
            # The generation drops at idle to save power, so only a narrowed width is a fault.
            yield host_finding("PF404", Status.passed, record, f"GPU {index}: PCIe Gen{gen} x{width} (max Gen{gen_max} x{width_max})")
        if gpu["persistence_mode"] is False:
            yield host_finding("PF405", Status.warn, record, f"GPU {index}: persistence mode is off",
                               "`nvidia-smi -pm 1` (or run nvidia-persistenced) so the driver does not reinitialise per process")
        if gpu["compute_mode"] == "prohibited":
            yield host_finding("PF406", Status.fail, record, f"GPU {index}: compute mode is Prohibited",
                               "`nvidia-smi -c DEFAULT -i N`")
        if gpu["mig_enabled"] and not view.config.training.gpu_mig:  # a cluster meant for MIG: PF869 judges it
            yield host_finding("PF407", Status.warn, record, f"GPU {index}: MIG is enabled",
                               "NCCL cannot span MIG instances; `nvidia-smi -mig 0` for multi-GPU training")
