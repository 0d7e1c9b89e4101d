"""UserLocks: the per-user turn locks of the router and the approvals (file locks: test_pgcluster)."""
import asyncio
import unittest

from ias.locks import UserLocks


class UserLocksTest(unittest.IsolatedAsyncioTestCase):
    async def test_one_holder_per_user_in_arrival_order_and_nothing_kept_after(self):
        locks, order = UserLocks(), []
        release = asyncio.Event()

        async def turn(user: str, name: str, wait: bool = False) -> None:
            async with locks.hold(user):
                order.append(name)
                if wait:
                    await release.wait()
        first = asyncio.create_task(turn("a", "a1", wait=True))
        while not order:
            await asyncio.sleep(0)
        queued = [asyncio.create_task(turn("a", f"a{i}")) for i in (2, 3)]
        await turn("b", "b1")                        # another user never waits for "a"
        self.assertEqual((order, len(locks)), (["a1", "b1"], 1))
        release.set()
        await asyncio.gather(first, *queued)
        self.assertEqual(order, ["a1", "b1", "a2", "a3"])
        self.assertEqual(len(locks), 0)

    async def test_a_cancelled_waiter_leaves_nothing_behind(self):
        locks = UserLocks()
        held, release = asyncio.Event(), asyncio.Event()

        async def holder() -> None:
            async with locks.hold("a"):
                held.set()
                await release.wait()

        async def waiter() -> None:
            async with locks.hold("a"):
                raise AssertionError("a cancelled waiter never holds the lock")
        first = asyncio.create_task(holder())
        await held.wait()
        second = asyncio.create_task(waiter())
        await asyncio.sleep(0)                       # let it queue on the lock
        second.cancel()
        await asyncio.gather(second, return_exceptions=True)
        self.assertEqual(len(locks), 1)
        release.set()
        await first
        self.assertEqual(len(locks), 0)


if __name__ == "__main__":
    unittest.main()
