// Note [Roll call] (process_group.h): the call itself. Rank 0 hosts the
// store (env rendezvous), so it stays until the ranks that answered have
// finished theirs (rollcall/done/<rank>, at most `linger`): a survivor that
// saw the failure a little later than rank 0 would otherwise lose the store
// mid-call and could name no one.
#include "roll_call.h"

#include <thread>
#include <vector>

#include "lockstep/util/error.h"

namespace lockstep {
namespace {

using Clock = std::chrono::steady_clock;

std::string key(int rank) {
  return "rollcall/" + std::to_string(rank);
}
std::string done_key(int rank) {
  return "rollcall/done/" + std::to_string(rank);
}

std::string names(const std::vector<int>& ranks) {
  std::string text;
  for (int r : ranks) text += (text.empty() ? "" : ", ") + std::to_string(r);
  return text;
}

std::string seconds_text(Clock::duration d) {
  return std::to_string(std::chrono::duration<double>(d).count()).substr(0, 4);
}

bool holds(C10dStore& store, const std::string& name) {
  return store.check({name});
}

}  // namespace

std::string roll_call_answer(C10dStore& store, int rank, int size, const RollCallOptions& options) {
  const auto start = Clock::now();
  std::vector<int> missing;
  bool polled = false;  // one complete pass over every rank's key
  try {
    store.set(key(rank), std::vector<uint8_t>{1});
    const auto deadline = start + options.grace;
    do {
      std::vector<int> now_missing;
      for (int r = 0; r < size; ++r) {
        if (!holds(store, key(r))) now_missing.push_back(r);
      }
      missing = std::move(now_missing);
      polled = true;
      if (missing.empty()) break;
      std::this_thread::sleep_for(options.poll);
    } while (Clock::now() < deadline);
  } catch (const std::exception& e) {
    if (!polled) {
      return "; the rendezvous store is unreachable too (" + what_of(e).substr(0, 120) +
             "): rank 0, which hosts it, has left, or is dead or cut off";
    }
    return "; rank(s) " + names(missing) + " did not answer the roll call in " +
           seconds_text(Clock::now() - start) + " s, until the store stopped answering (" +
           what_of(e).substr(0, 120) +
           "; rank 0, which hosts it, has probably left): dead, hung or cut off";
  }
  const std::string text =
      missing.empty() ? "; every rank answered the roll call, so none is dead or hung"
                      : "; rank(s) " + names(missing) + " did not answer the roll call within " +
                            seconds_text(options.grace) + " s: dead, hung or cut off";
  try {
    store.set(done_key(rank), std::vector<uint8_t>{1});
    if (rank == 0) {
      const auto until = Clock::now() + options.linger;
      // Every rank that has answered by now, a late one included; the
      // ones that never did are not waited for.
      for (int r = 1; r < size; ++r) {
        while (holds(store, key(r)) && !holds(store, done_key(r)) && Clock::now() < until)
          std::this_thread::sleep_for(options.poll);
      }
    }
  } catch (const std::exception&) {
    // the answer is complete; only the courtesy to later ranks failed
  }
  return text;
}

}  // namespace lockstep
