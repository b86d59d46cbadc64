# Simulated MI300X host (test stand-in, not product code): Debian bookworm with
# systemd as PID 1, sshd and Debian's docker.io. GPUs, ROCm and the amdgpu
# driver are stood in for by tests/fleet/fleet.py when a host starts.
ARG BASE
FROM ${BASE}
ENV DEBIAN_FRONTEND=noninteractive
RUN apt-get update -qq \
 && apt-get install -y -qq --no-install-recommends \
      systemd systemd-sysv dbus udev openssh-server docker.io iptables iproute2 nftables \
      curl sudo kmod procps less python3 \
 && apt-get clean && rm -rf /var/lib/apt/lists/*
# Units that cannot work in a container, and getty on a console that does not exist. systemd-sysctl
# would write a booting host's sysctl files into the one kernel every simulated host (of every fleet
# on the machine) shares: a host revived with a drifted kernel.numa_balancing would turn it on for all.
RUN systemctl mask systemd-udevd.service systemd-udevd-kernel.socket systemd-udevd-control.socket \
      getty@tty1.service console-getty.service systemd-modules-load.service sys-kernel-config.mount \
      systemd-sysctl.service \
 && mkdir -p /root/.ssh && chmod 700 /root/.ssh \
 && groupadd -f -r render && groupadd -f -r video
# Bootloader stand-in: see standin/update-grub.
COPY standin/update-grub /usr/sbin/update-grub
RUN mkdir -p /etc/default/grub.d \
 && printf 'GRUB_DEFAULT=0\nGRUB_CMDLINE_LINUX_DEFAULT="quiet"\nGRUB_CMDLINE_LINUX=""\n' > /etc/default/grub
STOPSIGNAL SIGRTMIN+3
CMD ["/lib/systemd/systemd"]
