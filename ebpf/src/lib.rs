//! pstack's eBPF surfaces: embedded CO-RE objects loaded with aya, aggregated per flow and per task.
