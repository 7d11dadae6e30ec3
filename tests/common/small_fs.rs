//! Small filesystems mounted for one test (a full disk without filling the
//! real one): a tmpfs or a loop-mounted ext4 image, unmounted when dropped.
//! Mounting needs root; without it the constructors say so and return
//! `None`, and the test skips.

use std::io::Write;
use std::path::PathBuf;
use std::process::Command;

/// A small filesystem mounted for one test; unmounted (and its image
/// removed) when dropped.
pub struct SmallFs {
    pub mount: PathBuf,
    image: Option<PathBuf>,
}

impl SmallFs {
    /// A 16 MiB tmpfs, or `None` (with a message) when it cannot be mounted.
    pub fn tmpfs(name: &str) -> Option<SmallFs> {
        let mount = scratch(name);
        let mounted = run(Command::new("mount").args(["-t", "tmpfs", "-o", "size=16m", "tmpfs"]).arg(&mount));
        if !mounted {
            eprintln!("skipped: cannot mount a tmpfs on {} (needs root)", mount.display());
            let _ = std::fs::remove_dir(&mount);
            return None;
        }
        Some(SmallFs { mount, image: None })
    }

    /// A 48 MiB ext4 image on a loop device, or `None` (with a message) when
    /// it cannot be made or mounted.
    pub fn ext4(name: &str) -> Option<SmallFs> {
        let mount = scratch(name);
        let image = mount.with_extension("img");
        let made = std::fs::File::create(&image).and_then(|file| file.set_len(48 << 20)).is_ok()
            && run(Command::new("mkfs.ext4").args(["-q", "-F", "-m", "0"]).arg(&image));
        let mounted = made && run(Command::new("mount").args(["-t", "ext4", "-o", "loop"]).arg(&image).arg(&mount));
        if !mounted {
            eprintln!(
                "skipped: cannot make and loop-mount an ext4 image on {} (needs root and loop devices)",
                mount.display()
            );
            let _ = std::fs::remove_file(&image);
            let _ = std::fs::remove_dir(&mount);
            return None;
        }
        Some(SmallFs { mount, image: Some(image) })
    }

    pub fn filler(&self) -> PathBuf {
        self.mount.join("filler")
    }

    /// Writes a file until the filesystem has not one block left.
    pub fn fill(&self) {
        let mut file = std::fs::File::create(self.filler()).unwrap();
        for chunk_size in [1 << 20, 64 << 10, 4 << 10, 512, 1] {
            let chunk = vec![7u8; chunk_size];
            while file.write_all(&chunk).is_ok() {}
        }
        let _ = file.sync_all();
        assert_eq!(self.available_bytes(), 0, "the filesystem is full");
    }

    /// Frees what [`SmallFs::fill`] took.
    pub fn free(&self) {
        std::fs::remove_file(self.filler()).unwrap();
    }

    pub fn available_bytes(&self) -> u64 {
        let path = std::ffi::CString::new(self.mount.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: statvfs on a NUL-terminated path into a zeroed struct.
        let mut stat: libc::statvfs = unsafe { std::mem::zeroed() };
        assert_eq!(unsafe { libc::statvfs(path.as_ptr(), &mut stat) }, 0);
        stat.f_bavail * stat.f_frsize
    }
}

impl Drop for SmallFs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.mount).status();
        let _ = std::fs::remove_dir_all(&self.mount);
        if let Some(image) = &self.image {
            let _ = std::fs::remove_file(image);
        }
    }
}

fn scratch(name: &str) -> PathBuf {
    let mount = std::env::temp_dir().join(format!("spate-full-{name}-{}", std::process::id()));
    let _ = Command::new("umount").arg(&mount).output();
    let _ = std::fs::remove_dir_all(&mount);
    std::fs::create_dir_all(&mount).unwrap();
    mount
}

fn run(command: &mut Command) -> bool {
    command.output().is_ok_and(|output| output.status.success())
}
