#include "sim/explore/resizable_programs.h"

namespace tpusim {

std::vector<std::shared_ptr<ResizablePrograms::Slot>> ResizablePrograms::slots(
    const Key& key) const {
  const std::lock_guard<std::mutex> lock(mutex_);
  const auto found = kept_.find(key);
  return found == kept_.end() ? std::vector<std::shared_ptr<Slot>>() : found->second;
}

bool ResizablePrograms::with_resized(
    size_t batch, size_t remat, const MeshShape& mesh,
    const std::function<void(const PartitionedProgram&)>& use) const {
  return first_slot(batch, remat, mesh, [&](const std::shared_ptr<Slot>& slot) {
    if (!slot->program.resize(mesh)) {
      return false;
    }
    use(slot->program.program());
    return true;
  });
}

bool ResizablePrograms::lend(size_t batch, size_t remat, const MeshShape& mesh,
                             PartitionedProgram& borrower, Loan& loan) const {
  return first_slot(batch, remat, mesh, [&](const std::shared_ptr<Slot>& slot) {
    if (!slot->program.resize(mesh)) {
      return false;
    }
    slot->lent = true;
    slot->program.swap_program(borrower);
    loan.slot_ = slot;
    loan.borrower_ = &borrower;
    loan.kept_mesh_ = std::move(borrower.mesh);
    return true;
  });
}

void ResizablePrograms::Loan::move_to(Loan& to, PartitionedProgram& borrower) {
  to.slot_ = std::move(slot_);
  to.borrower_ = &borrower;
  to.kept_mesh_ = std::move(kept_mesh_);
  slot_.reset();
  borrower_ = nullptr;
}

void ResizablePrograms::Loan::give_back() {
  if (slot_ == nullptr) {
    return;
  }
  borrower_->mesh = std::move(kept_mesh_);
  const std::lock_guard<std::mutex> lock(slot_->mutex);
  slot_->program.swap_program(*borrower_);
  slot_->lent = false;
  slot_.reset();
  borrower_ = nullptr;
}

std::optional<ComputeBounds> ResizablePrograms::bounds(
    size_t batch, size_t remat, const MeshShape& mesh, int64_t accumulation_steps,
    const std::vector<CostContext>& contexts) const {
  std::optional<ComputeBounds> found;
  first_slot(batch, remat, mesh, [&](const std::shared_ptr<Slot>& slot) {
    if (slot->costs == nullptr) {
      slot->costs = std::make_unique<ResizedOpCosts>(slot->program);
    }
    found = slot->costs->bounds(slot->program, mesh, accumulation_steps, contexts);
    return found.has_value();
  });
  return found;
}

void ResizablePrograms::offer(size_t batch, size_t remat, const PartitionedProgram& program,
                              const MeshShape& mesh) {
  const Key key{batch, remat, ResizableProgram::axes_above_one(mesh)};
  {
    const std::lock_guard<std::mutex> lock(mutex_);
    const auto found = kept_.find(key);
    if (count_ >= kMaxKept || (found != kept_.end() && found->second.size() >= kPerKey)) {
      return;
    }
  }
  std::optional<ResizableProgram> resizable = ResizableProgram::from(program, mesh);
  if (!resizable.has_value()) {
    return;
  }
  auto slot = std::make_shared<Slot>();
  slot->program = std::move(*resizable);
  const std::lock_guard<std::mutex> lock(mutex_);
  std::vector<std::shared_ptr<Slot>>& kept = kept_[key];
  if (count_ < kMaxKept && kept.size() < kPerKey) {
    kept.push_back(std::move(slot));
    ++count_;
  }
}

}  // namespace tpusim
