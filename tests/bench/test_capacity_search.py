"""bench/capacity.py's search over depth: from a guess it finds what the search from the
bottom finds, in fewer probes when the guess is close."""

from bench import capacity


def _Counted(answer: int):
    probes = []

    def Fits(n: int) -> bool:
        probes.append(n)
        return n <= answer

    return Fits, probes


def test_largest_from_a_guess_finds_the_largest_that_fits():
    for low in (1, 2, 8):
        for answer in (0, 1, 2, 7, 8, 9, 31, 40, 57):
            for start in (None, 1, 5, 8, 30, 40, 41, 100):
                fits, probes = _Counted(answer)
                found = capacity.Largest(fits, low, start)
                assert found == (answer if answer >= low else 0), (low, answer, start, probes)
                assert min(probes) >= low, (low, answer, start, probes)


def test_a_close_guess_takes_fewer_probes():
    for answer, start in ((40, 40), (40, 38), (40, 43), (34, 40)):
        fits, guessed = _Counted(answer)
        capacity.Largest(fits, 8, start)
        fits, plain = _Counted(answer)
        capacity.Largest(fits, 8)
        assert len(guessed) < len(plain), (answer, start, guessed, plain)
    fits, probes = _Counted(40)
    assert capacity.Largest(fits, 8, 40) == 40 and probes == [40, 41]
