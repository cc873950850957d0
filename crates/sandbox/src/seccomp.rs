//! The seccomp filter every confined command runs under, written as a classic BPF program
//! by hand (a few dozen instructions) and handed to bubblewrap through an inherited file
//! descriptor (`bwrap --seccomp FD`), which loads it right before it starts the command.
//!
//! The filter is a second wall behind the dropped capabilities and the non-root uid: it
//! answers `EPERM` to the system calls that change mounts or namespaces, or reach into other
//! processes or the kernel ([`DENIED_SYSCALLS`]), and to `clone` with any namespace flag;
//! `clone3` gets `ENOSYS` (its flags sit in memory a filter cannot read), so the C library
//! falls back to `clone`, whose flags it can. A system call of another architecture (a
//! 32-bit binary) ends the process, an x32 call gets `ENOSYS`: the numbers below only mean what they mean
//! for the architecture this crate was built for (x86_64 or aarch64; on any other the
//! filter is left out and [`filter`] returns `None`).

/// The system calls answered with `EPERM` inside the sandbox, by name.
pub const DENIED_SYSCALLS: &[&str] = &[
    "mount",
    "umount2",
    "pivot_root",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "move_mount",
    "open_tree",
    "mount_setattr",
    "unshare",
    "setns",
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "keyctl",
    "add_key",
    "request_key",
    "bpf",
    "perf_event_open",
    "kexec_load",
    "kexec_file_load",
    "init_module",
    "finit_module",
    "delete_module",
    "open_by_handle_at",
];

#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
mod imp {
    use libc::c_long;

    /// `struct sock_filter`.
    #[derive(Clone, Copy)]
    struct Insn {
        code: u16,
        jt: u8,
        jf: u8,
        k: u32,
    }

    const LD_W_ABS: u16 = 0x20; // BPF_LD (0) | BPF_W (0) | BPF_ABS
    const JEQ_K: u16 = 0x05 | 0x10; // BPF_JMP | BPF_JEQ | BPF_K
    const JGE_K: u16 = 0x05 | 0x30; // BPF_JMP | BPF_JGE | BPF_K
    const JSET_K: u16 = 0x05 | 0x40; // BPF_JMP | BPF_JSET | BPF_K
    const RET_K: u16 = 0x06; // BPF_RET | BPF_K

    const RET_KILL_PROCESS: u32 = 0x8000_0000;
    const RET_ERRNO: u32 = 0x0005_0000;
    const RET_ALLOW: u32 = 0x7fff_0000;

    // struct seccomp_data { int nr; __u32 arch; __u64 instruction_pointer; __u64 args[6]; }
    const OFF_NR: u32 = 0;
    const OFF_ARCH: u32 = 4;
    /// Low 32 bits of args[0] (little endian on both architectures).
    const OFF_ARG0_LO: u32 = 16;

    #[cfg(target_arch = "x86_64")]
    const AUDIT_ARCH: u32 = 0xC000_003E; // AUDIT_ARCH_X86_64
    #[cfg(target_arch = "aarch64")]
    const AUDIT_ARCH: u32 = 0xC000_00B7; // AUDIT_ARCH_AARCH64

    /// Set on x32 system call numbers (x86_64 only).
    #[cfg(target_arch = "x86_64")]
    const X32_SYSCALL_BIT: u32 = 0x4000_0000;

    const DENIED: &[c_long] = &[
        libc::SYS_mount,
        libc::SYS_umount2,
        libc::SYS_pivot_root,
        libc::SYS_fsopen,
        libc::SYS_fsconfig,
        libc::SYS_fsmount,
        libc::SYS_fspick,
        libc::SYS_move_mount,
        libc::SYS_open_tree,
        libc::SYS_mount_setattr,
        libc::SYS_unshare,
        libc::SYS_setns,
        libc::SYS_ptrace,
        libc::SYS_process_vm_readv,
        libc::SYS_process_vm_writev,
        libc::SYS_keyctl,
        libc::SYS_add_key,
        libc::SYS_request_key,
        libc::SYS_bpf,
        libc::SYS_perf_event_open,
        libc::SYS_kexec_load,
        libc::SYS_kexec_file_load,
        libc::SYS_init_module,
        libc::SYS_finit_module,
        libc::SYS_delete_module,
        libc::SYS_open_by_handle_at,
    ];

    /// Every `CLONE_NEW*` flag `clone` takes (`CLONE_NEWTIME` shares its bit with the exit
    /// signal there and exists only for `clone3`/`unshare`, both refused as a whole).
    const CLONE_NS_FLAGS: u32 = (libc::CLONE_NEWNS
        | libc::CLONE_NEWCGROUP
        | libc::CLONE_NEWUTS
        | libc::CLONE_NEWIPC
        | libc::CLONE_NEWUSER
        | libc::CLONE_NEWPID
        | libc::CLONE_NEWNET) as u32;

    fn stmt(code: u16, k: u32) -> Insn {
        Insn { code, jt: 0, jf: 0, k }
    }

    fn jump(code: u16, k: u32, jt: u8, jf: u8) -> Insn {
        Insn { code, jt, jf, k }
    }

    pub(crate) fn program() -> Vec<u8> {
        let eperm = RET_ERRNO | libc::EPERM as u32;
        let enosys = RET_ERRNO | libc::ENOSYS as u32;
        let mut p = vec![
            stmt(LD_W_ABS, OFF_ARCH),
            jump(JEQ_K, AUDIT_ARCH, 1, 0),
            stmt(RET_K, RET_KILL_PROCESS),
            stmt(LD_W_ABS, OFF_NR),
        ];
        // x32 calls (and out-of-range numbers): not supported here.
        #[cfg(target_arch = "x86_64")]
        p.extend([jump(JGE_K, X32_SYSCALL_BIT, 0, 1), stmt(RET_K, enosys)]);
        for &nr in DENIED {
            p.extend([jump(JEQ_K, nr as u32, 0, 1), stmt(RET_K, eperm)]);
        }
        p.extend([
            jump(JEQ_K, libc::SYS_clone3 as u32, 0, 1),
            stmt(RET_K, enosys),
            jump(JEQ_K, libc::SYS_clone as u32, 1, 0),
            stmt(RET_K, RET_ALLOW),
            // clone: its first argument holds the flags on both architectures.
            stmt(LD_W_ABS, OFF_ARG0_LO),
            jump(JSET_K, CLONE_NS_FLAGS, 0, 1),
            stmt(RET_K, eperm),
            stmt(RET_K, RET_ALLOW),
        ]);
        let mut bytes = Vec::with_capacity(p.len() * 8);
        for i in p {
            bytes.extend_from_slice(&i.code.to_ne_bytes());
            bytes.push(i.jt);
            bytes.push(i.jf);
            bytes.extend_from_slice(&i.k.to_ne_bytes());
        }
        bytes
    }
}

/// The filter as the bytes of a `struct sock_filter` array, the form `bwrap --seccomp`
/// reads; `None` on architectures the filter is not written for.
pub fn filter() -> Option<Vec<u8>> {
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    {
        Some(imp::program())
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        None
    }
}

/// An anonymous in-memory file holding `bytes`, read from its start, close-on-exec (the
/// caller clears that flag in the one child that must inherit it).
pub(crate) fn memfd_with(bytes: &[u8]) -> std::io::Result<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    // SAFETY: plain syscalls on a descriptor we own; the name is a NUL-terminated literal.
    unsafe {
        let fd = libc::memfd_create(c"frognano-seccomp".as_ptr(), libc::MFD_CLOEXEC);
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let owned = std::os::fd::OwnedFd::from_raw_fd(fd);
        let mut done = 0;
        while done < bytes.len() {
            let n = libc::write(fd, bytes[done..].as_ptr().cast(), bytes.len() - done);
            if n < 0 {
                return Err(std::io::Error::last_os_error());
            }
            done += n as usize;
        }
        if libc::lseek(fd, 0, libc::SEEK_SET) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(owned)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_filter_is_whole_instructions_and_names_every_denied_call() {
        if let Some(p) = super::filter() {
            assert_eq!(p.len() % 8, 0);
            // arch check (3) + load nr (1) + x32 guard (2, x86_64) + 2 per denied call + clone tail (8)
            let x32 = if cfg!(target_arch = "x86_64") { 2 } else { 0 };
            assert_eq!(p.len() / 8, 4 + x32 + 2 * super::DENIED_SYSCALLS.len() + 8);
            assert!(p.len() / 8 < 256, "jumps are 8-bit");
        }
    }
}
