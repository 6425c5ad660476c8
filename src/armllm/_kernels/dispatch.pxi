# dispatch.pxi: included by _ext.pyx: the CPU's features, the kernel variants built and
# the best one it runs, and _KernelTable, the root of Kernels: the dispatch table of one
# variant, its name and what runs in each slot.


# Kernel slot names, in table order (ARMLLM_KERNEL_SLOTS in armllm_kernels.h).
KERNEL_NAMES = tuple(armllm_slot_name(i).decode() for i in range(ARMLLM_NUM_SLOTS))


# ---------------------------------------------------------------- CPU info


def cpu_features():
    """Architecture, detected feature names, SVE vector length in bits, why AMX tile
    data is not usable ("" when it is, or without AMX), and on x86 cpuid's vendor,
    family and model ("", 0, 0 elsewhere)."""
    cdef const armllm_cpu *cpu = armllm_cpu_detect()
    names = [armllm_cpu_feature_name(f).decode() for f in range(ARMLLM_CPU_NUM_FEATURES)
             if armllm_cpu_has(cpu, f)]
    return {"arch": cpu.arch.decode(), "features": names,
            "sve_vector_bits": cpu.sve_vector_bits, "amx_denied": cpu.amx_denied.decode(),
            "vendor": cpu.vendor.decode(), "family": cpu.family, "model": cpu.model}


def x86_decode_streams():
    """Panel streams a thread of the AVX-512 quantized decode GEMVs reads at once
    (cpu.h: 1 on Zen 4, else 2, unless set)."""
    return armllm_x86_decode_streams()


def set_x86_decode_streams(int streams):
    """Sets that count: 1 or 2, or 0 for the CPU's choice again."""
    if streams not in (0, 1, 2):
        raise ValueError(f"decode streams must be 1 or 2 (0: the CPU's choice), got {streams}")
    armllm_set_x86_decode_streams(streams)


def isa_built():
    """Kernel variants compiled into this build, best first."""
    cdef const char *const *names = armllm_isa_built()
    out = []
    cdef int i = 0
    while names[i] != NULL:
        out.append(names[i].decode())
        i += 1
    return out


def isa_best():
    """The best variant this CPU can run."""
    return armllm_isa_best(armllm_cpu_detect()).decode()


def allowed_cpus():
    """CPUs in this process's affinity mask."""
    return armllm_allowed_cpus()


def atomic_impl():
    """The fetch-add the pool uses on this CPU."""
    return armllm_pool_atomic_impl().decode()


cdef const armllm_kernels *_table(str isa) except NULL:
    cdef char err[512]
    cdef bytes name = isa.encode()
    cdef const armllm_kernels *t = armllm_isa_table(name, armllm_cpu_detect(), err, sizeof(err))
    if t == NULL:
        raise ValueError(err.decode())
    return t


cdef class _KernelTable:
    """One kernel variant's dispatch table; each family's wrappers extend it (Kernels)."""
    cdef const armllm_kernels *t

    def __cinit__(self, str isa):
        self.t = _table(isa)

    @property
    def isa(self):
        return self.t.isa.decode()

    @property
    def impl(self):
        """What runs in each kernel slot: the variant whose code it is, with
        "+choice" for a run-time choice inside that code (e.g. "neon+dotprod")."""
        cdef char buf[64]
        impl = {}
        for i, name in enumerate(KERNEL_NAMES):
            impl[name] = armllm_slot_impl(self.t, i, buf, sizeof(buf)).decode()
        return impl
