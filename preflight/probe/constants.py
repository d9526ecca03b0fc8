"""The facts probe's constants: NVML's and the kernel's numbers, and the bounds on what it reads."""

from __future__ import annotations

SCHEMA_VERSION = 4
LOOKUP_TIMEOUT_S = 5.0  # a resolver that has not answered by then is as good as broken for a rendezvous
SMI_TIMEOUT_S = 5.0
JOURNAL_TIMEOUT_S = 3.0  # journalctl over a large journal: the kernel log is a detail, not worth a stalled probe
KERNEL_LOG_LOOKBACK_S = 24 * 3600  # the checks' window (thresholds.xid_window_h) is at most this
KERNEL_LOG_TAIL_BYTES = 4 << 20  # of /var/log/kern.log: its last lines, never the whole file
KERNEL_LOG_MAX_EVENTS = 128  # distinct (kind, PCI address, code) kept; a storm of one Xid is one event with a count
KMSG_MAX_RECORDS = 200_000  # the ring buffer holds far fewer; a bound on the read loop all the same
IB_COUNTERS = ("link_downed", "symbol_error", "port_rcv_errors", "link_error_recovery", "port_xmit_discards",
               "local_link_integrity_errors", "excessive_buffer_overrun_errors")
# hw_counters/ (mlx5) of congestion and transport errors (the driver's own counters; none counts link downs).
IB_HW_COUNTERS = ("out_of_buffer", "out_of_sequence", "local_ack_timeout_err", "packet_seq_err",
                  "implied_nak_seq_err", "rnr_nak_retry_err", "req_cqe_error", "resp_cqe_error", "roce_adp_retrans",
                  "roce_adp_retrans_to", "roce_slow_restart", "np_cnp_sent", "rp_cnp_handled", "np_ecn_marked_roce_packets")
NVLINK_ERROR_COUNTERS = (("replay", 0), ("recovery", 1), ("crc_flit", 2), ("crc_data", 3))  # NVML_NVLINK_ERROR_DL_*
# `nvidia-smi nvlink -e`'s names for the same counters (its "CRC Errors" is the flit CRC, DL_CRC_FLIT).
SMI_NVLINK_ERRORS = {"Replay Errors": "replay", "Recovery Errors": "recovery", "CRC Errors": "crc_flit",
                     "CRC Data Errors": "crc_data"}
NVLINK_MAX_LINKS = 18  # NVML_NVLINK_MAX_LINKS
FABRIC_STATES = {0: "not_supported", 1: "not_started", 2: "in_progress", 3: "completed"}  # NVML_GPU_FABRIC_STATE_*
FABRIC_HEALTH = {1: "Healthy", 2: "Unhealthy", 3: "Limited Capacity"}  # NVML_GPU_FABRIC_HEALTH_SUMMARY_*, as nvidia-smi says
# NVML's clocks event reason bits (nvmlClocksEventReason*) under the names nvidia-smi -q -x gives them.
CLOCK_EVENT_REASONS = ((0x1, "gpu_idle"), (0x2, "applications_clocks_setting"), (0x4, "sw_power_cap"), (0x8, "hw_slowdown"),
                       (0x10, "sync_boost"), (0x20, "sw_thermal_slowdown"), (0x40, "hw_thermal_slowdown"),
                       (0x80, "hw_power_brake_slowdown"), (0x100, "display_clock_setting"))
RECOVERY_ACTIONS = {0: "none", 1: "gpu_reset", 2: "node_reboot", 3: "drain_p2p", 4: "drain_and_reset",  # NVML_GPU_RECOVERY_ACTION_*
                    5: "recover_imex_domain", 6: "bus_reset", 7: "system_reboot"}
# nvidia-smi's XML cell for NVML's DisplayClockSetting reason says "clocks" (R460 and R580 captures alike).
SMI_REASON_NAMES = {"display_clocks_setting": "display_clock_setting"}
SMI_RECOVERY_ACTIONS = {"gpu reset": "gpu_reset", "reset": "gpu_reset", "node reboot": "node_reboot", "reboot": "node_reboot",
                        "drain p2p": "drain_p2p", "drain and reset": "drain_and_reset", "system reboot": "system_reboot"}
NVML_FI_DEV_GET_GPU_RECOVERY_ACTION = 230  # nvml.h; older pynvml lack the name
NVML_CALL_ERRORS: list[str] = []  # this run's NVML calls that failed other than by NVML's answer (see ask)
NVML_CALL_ERRORS_MAX = 32
# The ACS control register's bits (PCIe base spec 7.7.8.3) under the names lspci -vvv prints for them.
ACS_FLAGS = ("SrcValid", "TransBlk", "ReqRedir", "CmpltRedir", "UpstreamFwd", "EgressCtrl", "DirectTrans")
PCI_EXT_CAP_ACS = 0x000D
FABRIC_MANAGER_UNITS = ("/lib/systemd/system/nvidia-fabricmanager.service", "/usr/lib/systemd/system/nvidia-fabricmanager.service",
                        "/etc/systemd/system/nvidia-fabricmanager.service")
ENV_PREFIXES = ("NCCL_", "TORCH_NCCL_", "TORCH_DISTRIBUTED_", "GLOO_")
ENV_NAMES = ("CUDA_VISIBLE_DEVICES",)
COMPUTE_MODES = {0: "default", 1: "exclusive_thread", 2: "prohibited", 3: "exclusive_process"}
SIOCGIFCONF = 0x8912
SIOCGIFNETMASK = 0x891B
ARPHRD_LOOPBACK = 772
IFF_LOOPBACK = 0x8

SMI_GPU_FIELDS = (
    "index", "uuid", "pci.bus_id", "memory.total", "memory.used", "ecc.mode.current",
    "ecc.errors.uncorrected.volatile.total", "ecc.errors.uncorrected.aggregate.total",
    "pcie.link.gen.current", "pcie.link.gen.max", "pcie.link.width.current", "pcie.link.width.max",
    "persistence_mode", "compute_mode", "mig.mode.current", "driver_version",
    "name",  # last: the only free text, so a comma in it cannot shift the other columns
)
SMI_APP_FIELDS = ("gpu_uuid", "pid", "used_memory", "process_name")
SMI_REMAP_FIELDS = ("gpu_bus_id", "remapped_rows.pending", "remapped_rows.failure")
