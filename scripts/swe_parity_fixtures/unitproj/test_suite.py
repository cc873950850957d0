# Fixture suite run with `python -m unittest -v`: the output shape of Django's runtests.py.
import sys
import unittest


class Arith(unittest.TestCase):
    def test_ok(self):
        self.assertEqual(2, 2)

    def test_fail(self):
        self.assertEqual(2, 3)

    def test_error(self):
        raise ValueError("boom")

    @unittest.skip("not today")
    def test_skipped(self):
        pass

    @unittest.expectedFailure
    def test_expected_failure(self):
        self.assertTrue(False)

    def test_noisy_ok(self):
        # Output between "..." and "ok" makes Django's parser use its prev_test rule.
        sys.stderr.write("System check identified no issues (0 silenced).\n")
        sys.stderr.flush()


if __name__ == "__main__":
    unittest.main()
