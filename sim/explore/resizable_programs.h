// sim/explore/resizable_programs.h: per-device programs the explorer partitioned, kept by (batch,
// remat policy, axes larger than 1) so that other meshes get theirs by re-sizing one
// (sharding/program_resize.h: the same program partition() would build there) instead of
// partitioning. Shared by the worker threads of one schedule's search (a schedule has its own
// training steps).
//
// A mesh of another equivalence key but the same axes larger than 1 takes the partitioner down
// the same path wherever the recorded size choices come out the same; the kept program, re-sized
// for that mesh, is then the mesh's own program: its TensorCore bound (step_bounds.h) needs no
// copy (nor a whole re-size: bounds()), and a copy of it replaces the partition. Memory is capped:
// kPerKey programs per key and kMaxKept in all; a program over the caps is not kept.
//
// Example:
//   ResizablePrograms kept;
//   kept.offer(batch, remat, program, mesh_a);  // after partitioning on mesh_a
//   kept.with_resized(batch, remat, mesh_b, [&](const PartitionedProgram& program) { ... });
//   ResizablePrograms::Loan loan;
//   kept.lend(batch, remat, mesh_c, program, loan);  // no copy: back in its slot when loan ends
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <tuple>
#include <vector>

#include "sharding/program_resize.h"
#include "sim/explore/resized_op_costs.h"
#include "sim/explore/step_bounds.h"

namespace tpusim {

class ResizablePrograms {
  struct Slot;

 public:
  // A kept program lent to a borrower (lend()): its slot is skipped by every other call until the
  // loan ends (give_back() or destruction), when the program goes back to the slot.
  class Loan {
   public:
    Loan() = default;
    Loan(const Loan&) = delete;
    Loan& operator=(const Loan&) = delete;
    ~Loan() { give_back(); }
    bool active() const { return slot_ != nullptr; }
    // The borrower's program goes back to the slot (the borrower gets what it held before).
    void give_back();
    // The borrower's program has moved to `borrower`: `to` (not active) holds the loan now.
    void move_to(Loan& to, PartitionedProgram& borrower);

   private:
    friend class ResizablePrograms;
    std::shared_ptr<Slot> slot_;
    PartitionedProgram* borrower_ = nullptr;
    DeviceMesh kept_mesh_;  // the program's own, while the borrower sets its mesh
  };

  static constexpr size_t kPerKey = 3;
  static constexpr size_t kMaxKept = 1024;

  // Calls `use` with the first kept program of (batch, remat) that re-sizes for `mesh` (under that
  // program's lock; its DeviceMesh is the kept one's); false when none does.
  bool with_resized(size_t batch, size_t remat, const MeshShape& mesh,
                    const std::function<void(const PartitionedProgram&)>& use) const;
  // As with_resized, but the re-sized program is swapped into `borrower` (no copy) until `loan`
  // ends: no other call re-sizes it meanwhile. `loan` must not be active; false when none
  // re-sizes (or every one that would is lent).
  bool lend(size_t batch, size_t remat, const MeshShape& mesh, PartitionedProgram& borrower,
            Loan& loan) const;
  // The TensorCore bounds (keep_forward_ops) of the first kept program of (batch, remat) that
  // re-sizes for `mesh`, as with_resized would give them, bit for bit, without re-sizing the whole
  // program (resized_op_costs.h); nullopt when none re-sizes.
  std::optional<ComputeBounds> bounds(size_t batch, size_t remat, const MeshShape& mesh,
                                      int64_t accumulation_steps,
                                      const std::vector<CostContext>& contexts) const;
  // Keeps `program`, partitioned for (batch, remat) on `mesh`, unless a cap is reached or it made
  // a size choice that is not recorded.
  void offer(size_t batch, size_t remat, const PartitionedProgram& program, const MeshShape& mesh);

 private:
  struct Slot {
    std::mutex mutex;   // the program is re-sized in place
    bool lent = false;  // its program is a borrower's (lend)
    ResizableProgram program;
    std::unique_ptr<ResizedOpCosts> costs;  // made by the first bounds()
  };
  using Key = std::tuple<size_t, size_t, uint32_t>;  // batch, remat, axes larger than 1
  std::vector<std::shared_ptr<Slot>> slots(const Key& key) const;
  // Offers each slot kept for (batch, remat, the mesh's axes larger than 1) that is not lent to
  // `try_slot`, under the slot's lock, until it returns true (then true).
  template <typename TrySlot>
  bool first_slot(size_t batch, size_t remat, const MeshShape& mesh, TrySlot&& try_slot) const {
    for (const std::shared_ptr<Slot>& slot :
         slots({batch, remat, ResizableProgram::axes_above_one(mesh)})) {
      const std::lock_guard<std::mutex> lock(slot->mutex);
      if (!slot->lent && try_slot(slot)) {
        return true;
      }
    }
    return false;
  }

  mutable std::mutex mutex_;
  std::map<Key, std::vector<std::shared_ptr<Slot>>> kept_;
  size_t count_ = 0;
};

}  // namespace tpusim
