"""The packed byte layout shared by the C++ kernels and every framework's implementation of them:
a byte holds ``8 / bits`` codes, the first element in the highest bits (numpy.packbits order,
MXNet's 2-bit order)."""

# bit offsets of the codes within a byte, first element first
SHIFTS = {1: (7, 6, 5, 4, 3, 2, 1, 0), 2: (6, 4, 2, 0), 4: (4, 0), 8: (0,)}


def packed_bytes(n: int, bits: int) -> int:
    """Bytes that ``n`` codes of ``bits`` bits occupy."""
    return (n * bits + 7) // 8


def check_minmax(owner: str, chunk: int, bits: int) -> None:
    """The C++ kernels' rule for minmax at 4 bits, for their Python twins and :class:`Int4`: chunks
    start on a byte (ValueError naming ``owner``)."""
    if bits == 4 and chunk % 2:
        raise ValueError(f"{owner}: chunk={chunk}; allowed: an even number with bits=4 "
                         "(two codes per byte, a chunk starts on a byte)")
