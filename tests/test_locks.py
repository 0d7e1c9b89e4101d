"""UserLocks: the per-user FIFO locks of the router and the approvals (file locks: test_pgcluster)."""
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

    async def test_places_come_up_in_the_order_taken_whatever_each_awaits_before_entering(self):
        locks, order = UserLocks(), []
        first, second, third = (locks.place("a") for _ in range(3))    # taken at once, in this order
        looked_up = {"first": asyncio.Event(), "third": asyncio.Event()}

        async def enter(place, name: str) -> None:
            await looked_up[name].wait()             # what each looks up first, the first one slower
            async with place:
                order.append(name)

        async def settle() -> None:
            for _ in range(5):
                await asyncio.sleep(0)
        tasks = [asyncio.create_task(enter(first, "first")), asyncio.create_task(enter(third, "third"))]
        looked_up["third"].set()
        await settle()
        self.assertEqual(order, [])                  # the third waits for the first, not yet entered
        looked_up["first"].set()
        await settle()
        self.assertEqual(order, ["first"])          # and for the second, taken but never entered ...
        second.release()                             # ... until it gives its place up
        second.release()                             # (idempotent)
        await asyncio.gather(*tasks)
        self.assertEqual((order, len(locks)), (["first", "third"], 0))

if __name__ == "__main__":
    unittest.main()
