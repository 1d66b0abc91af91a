# Sourced by the bench/cuda/*.sh device scripts (from the repository root on the GPU machine):
# unpacks the carried pcre2/pkgconf .debs (the image has neither) and points pkg-config and the
# loader at them. Sets OUT (log folder), C (.devcarry/cuda: debs/ and shared/), P (unpacked deps)
# and PKG (extra cmake flag naming pkgconf when the image has no pkg-config).
OUT=${OUT:-/tmp/strata_out}
mkdir -p "$OUT"
C=$PWD/.devcarry/cuda
P=/tmp/strata_deps
mkdir -p $P
for f in $C/debs/*.deb; do dpkg -x "$f" $P; done
for pc in $P/usr/lib/x86_64-linux-gnu/pkgconfig/*.pc; do sed -i "s|^prefix=.*|prefix=$P/usr|" "$pc"; done
export PKG_CONFIG_PATH=$P/usr/lib/x86_64-linux-gnu/pkgconfig
export LD_LIBRARY_PATH=$P/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
PKG=""
command -v pkg-config >/dev/null || PKG="-DPKG_CONFIG_EXECUTABLE=$P/usr/bin/pkgconf"
